/**
 * A chat answer streamed as Server-Sent Events: its head, its `data:` frames, and its end.
 *
 * The frames of one turn of the event loop leave together once the turn's work is done: gathered as text and
 * written as one piece, so one HTTP chunk and one socket write instead of one of each per frame (the stream's
 * bytes are the same; only where the chunked encoding cuts them differs, which no SSE reader sees). A frame is
 * not held past its turn: a streamed token of the local engine with a delay, or an upstream's event read
 * alone, leaves in the turn it was written in.
 *
 * The head leaves with the first frames of its turn, and the last frames with the stream's end, each in one
 * socket write (the response corked meanwhile: on loopback each write costs tens of µs).
 *
 * Backpressure: when the socket asks to wait (a write answers false), `write` answers a promise that settles
 * once it drains (or the response closes), and the caller waits for it before producing more. What one turn
 * gathers is what one turn produces: the events of one read of an upstream's answer, or the local engine's
 * tokens between two of its pauses.
 */
import type { ServerResponse } from 'node:http';

export type EventStream = {
  /** Adds one `data:` frame to the turn's; a promise only while the socket asks to wait. */
  write(data: string): Promise<void> | undefined;
  /** Writes what is gathered and ends the response, in one socket write. */
  end(): void;
};

/** Writes the head of the stream on `res` (200, `text/event-stream`); `aborted`: the client is gone. */
export function openEventStream(res: ServerResponse, aborted: () => boolean): EventStream {
  let frames = '';
  let corked = false;
  let due = false;
  let blocked: Promise<void> | undefined;

  const drained = () =>
    new Promise<void>((resolve) => {
      const done = () => {
        res.off('drain', done);
        res.off('close', done);
        blocked = undefined;
        resolve();
      };
      res.on('drain', done);
      res.on('close', done);
    });

  /** At the end of the turn: the turn's frames in one write, then the socket uncorked. */
  const flush = () => {
    due = false;
    if (frames !== '' && !res.destroyed) {
      const text = frames;
      frames = '';
      if (!res.write(text) && !blocked) blocked = drained();
    }
    if (corked) {
      corked = false;
      res.uncork();
    }
  };
  const flushDue = () => {
    if (due) return;
    due = true;
    process.nextTick(flush);
  };

  res.writeHead(200, {
    'Content-Type': 'text/event-stream; charset=utf-8',
    'Cache-Control': 'no-cache',
    Connection: 'keep-alive',
    'X-Accel-Buffering': 'no',
  });
  // The head leaves in this turn whatever follows, with the turn's first frames when there are any.
  corked = true;
  res.cork();
  res.flushHeaders();
  flushDue();

  return {
    write(data) {
      if (res.destroyed || aborted()) return undefined;
      frames += `data: ${data}\n\n`;
      flushDue();
      return blocked;
    },
    end() {
      // `end` uncorks the socket fully: the last frames and the end leave in one write.
      if (frames !== '' && !res.destroyed) res.write(frames);
      frames = '';
      corked = false;
      res.end();
    },
  };
}
