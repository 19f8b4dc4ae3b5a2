/**
 * Where the server's log lines go: standard output, gathered for a short while and written a batch at a time.
 *
 * Why: at the default level (`info`) every request logs a line when its response ends. pino's default
 * destination writes each line asynchronously as it comes (sonic-boom, `fs.write` on libuv's thread pool), so
 * a request served alone cost a thread-pool hand-off and its completion on the main thread, right when the
 * next request is arriving: 62 to 116 µs more JSON-RPC added p50 than at `warn`, which logs no line per
 * request, and 49 to 63 µs more on the chat upstream adapter. With the lines gathered (`bench:ab`, both sides
 * at `LOG_LEVEL=info`, 6 rounds): the JSON-RPC proxy's added p50 65 µs lower (in 6 of 6), the adapter's 50 µs
 * lower (5 of 6), one read system call fewer per request (bench/HISTORY.md, twenty-eighth round).
 *
 * How: lines are appended to a string and handed to pino's own destination (sonic-boom, asynchronous, with
 * its handling of a closed pipe) once `maxBytes` are gathered, or `flushMs` after the first line of a batch,
 * whichever comes first; a line is never held longer than that. `flush()` hands on what is gathered now (the
 * server calls it once it listens, so that its `listening` line shows at once). On `process.exit` (every
 * way this server stops, a fatal start-up error included) what is gathered is written synchronously, as
 * pino does for its own asynchronous destination. Only a process killed outright (SIGKILL) loses what it had
 * gathered: at most `flushMs` of lines, as pino's asynchronous destination can lose what it had not written.
 */
import { pino } from 'pino';

export type LogDestination = {
  /** pino's destination interface: takes one serialised line (with its newline). */
  write(line: string): boolean;
  /**
   * Hands what is gathered to the writer now; `done` once the writer has it (pino's asynchronous destination
   * writes it as soon as no write is under way, and calls `done` at once).
   */
  flush(done?: (error?: Error) => void): void;
  /**
   * Writes what the writer holds and what is gathered before returning (but for a write the writer already has
   * under way on the thread pool, which completes on its own).
   */
  flushSync(): void;
};

export type LogDestinationOptions = {
  /** File descriptor to write to (default 1, standard output). */
  fd?: number;
  /** Longest a line waits, in ms (default 100). */
  flushMs?: number;
  /** A batch of this many characters or more is written at once (default 16 KiB). */
  maxBytes?: number;
  /** What writes the batches (tests); default pino's asynchronous destination on `fd`. */
  writer?: LogDestination;
};

export function createLogDestination(options: LogDestinationOptions = {}): LogDestination {
  const flushMs = options.flushMs ?? 100;
  const maxBytes = options.maxBytes ?? 16 * 1024;
  // minLength 0: sonic-boom writes what it is given as soon as no write is under way.
  const writer: LogDestination =
    options.writer ?? pino.destination({ dest: options.fd ?? 1, sync: false, minLength: 0 });
  // What flushSync writes itself, on the same descriptor: handed to the asynchronous writer, a batch would start
  // an `fs.write` on the thread pool, which that writer's own flushSync leaves under way (sonic-boom writes
  // only what is queued behind it), so the batch could still be on its way when flushSync returned, or when
  // the process ended. sonic-boom in its synchronous mode, with its handling of a full pipe.
  const direct = options.writer
    ? undefined
    : pino.destination({ dest: options.fd ?? 1, sync: true, minLength: 0 });
  let gathered = '';
  let timer: NodeJS.Timeout | undefined;

  /** What is gathered, taken (and its timer stopped). */
  const take = () => {
    if (timer) {
      clearTimeout(timer);
      timer = undefined;
    }
    const batch = gathered;
    gathered = '';
    return batch;
  };
  const handOn = () => {
    const batch = take();
    if (batch !== '') writer.write(batch);
  };

  const destination: LogDestination = {
    write(line) {
      gathered += line;
      if (gathered.length >= maxBytes) handOn();
      else if (!timer) {
        timer = setTimeout(handOn, flushMs);
        // A batch waiting must not keep a process alive that has nothing else to do: exit writes it.
        timer.unref();
      }
      return true;
    },
    flush(done) {
      handOn();
      writer.flush(done);
    },
    flushSync() {
      if (!direct) {
        handOn();
        writer.flushSync();
        return;
      }
      const batch = take();
      // What the writer holds first (written now, but for a write already under way), then the batch.
      writer.flushSync();
      if (batch !== '') direct.write(batch);
    },
  };
  process.once('exit', () => {
    try {
      destination.flushSync();
    } catch {
      // Standard output gone (a closed pipe): nothing left to write to.
    }
  });
  return destination;
}
