/**
 * Changes held in this process and written behind (held-counts.ts, held-credits.ts): once a change is made a
 * timer is set, and at most `flushMs` later what is pending is taken as one batch and written in one short
 * write. A batch that fails is handed back to be held again, and goes with the next flush. `flush` resolves
 * once every batch taken until then is committed (or handed back); `close` flushes and sets no timer after.
 */
export type WriteBehindOptions<B> = {
  /** How long a change waits for its write. */
  flushMs: number;
  /** What to write now, marked as being written; undefined when nothing is. */
  take(): B | undefined;
  /** Writes a batch (one short write: Database.write). */
  write(batch: B): Promise<void>;
  /** The batch is committed. */
  written(batch: B): void;
  /** The batch was not written: held again, for the next flush. */
  failed(batch: B): void;
};

export type WriteBehind = ReturnType<typeof writeBehind>;

export function writeBehind<B>(options: WriteBehindOptions<B>) {
  let timer: NodeJS.Timeout | undefined;
  let writing: Promise<void> | undefined;
  let closed = false;

  /** Writes what is pending; resolves once it and every earlier batch are committed (or handed back). */
  function flush(): Promise<void> {
    if (timer) clearTimeout(timer);
    timer = undefined;
    const batch = options.take();
    if (batch === undefined) return writing ?? Promise.resolve();
    const written = options.write(batch).then(
      () => options.written(batch),
      () => {
        options.failed(batch);
        schedule();
      },
    );
    const all: Promise<void> = Promise.all([writing, written]).then(() => {
      if (writing === all) writing = undefined;
    });
    writing = all;
    return all;
  }

  /** A change was made: it is written within `flushMs`. */
  function schedule() {
    if (timer || closed) return;
    timer = setTimeout(() => void flush(), options.flushMs);
    timer.unref();
  }

  return {
    schedule,
    flush,
    /** Writes what is pending, and sets no timer after (the database is closing). */
    close(): Promise<void> {
      const last = flush();
      closed = true;
      return last;
    },
  };
}
