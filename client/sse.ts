/**
 * A Server-Sent Events reader (the WHATWG event-stream format) and the chat-completion stream on top of it.
 * Framework-free: it reads any `ReadableStream<Uint8Array>`, so it serves browsers, Node and the tests alike.
 */
import type { ChatCompletionChunk, ChatCompletionStreamError } from '../generated/api.d.ts';

/** One dispatched event: `data` lines joined by `\n`; `event` defaults to `message`. */
export type SseEvent = { event: string; data: string; id?: string };

/** Yields each event of an event stream as it completes; a final event without its blank line is dropped. */
export async function* readSseEvents(stream: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  yield* readSseChunks(readerChunks(stream));
}

/** The chunks of a stream through its reader (browsers cannot iterate a ReadableStream directly). */
export async function* readerChunks(stream: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = stream.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      yield value;
    }
  } finally {
    reader.releaseLock();
  }
}

/** readSseEvents over any source of byte chunks (a Node stream, an async generator). */
export async function* readSseChunks(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<SseEvent> {
  const parser = createSseParser();
  for await (const value of chunks) yield* parser.push(value);
  yield* parser.end();
}

/**
 * An event stream read chunk by chunk by a caller that holds the chunks itself: `push` gives the events a chunk
 * completes, `end` those the stream's end completes (a last line ended by a lone CR). No promise per event, as
 * an async generator makes: a server that forwards a stream handles a chunk's events in one go. Each call's
 * events are read before the next call.
 */
export type SseParser = {
  push(chunk: Uint8Array): Iterable<SseEvent>;
  end(): Iterable<SseEvent>;
};

export function createSseParser(): SseParser {
  const decoder = new Utf8Chunks();
  const state: SseState = { buffer: '', data: [], event: '', id: undefined };
  return {
    push(chunk) {
      state.buffer += decoder.text(chunk);
      return dispatch(state, false);
    },
    end() {
      state.buffer += decoder.rest();
      return dispatch(state, true);
    },
  };
}

/**
 * A UTF-8 byte stream decoded chunk by chunk, as `TextDecoder`'s `decode(chunk, { stream: true })` decodes it,
 * the same text however the bytes are cut: a character whose bytes a chunk ends in the middle of is held (its
 * first one to three bytes) and decoded with the next chunk, and a byte-order mark is dropped at the stream's
 * start only. Each chunk is decoded whole, not in streaming mode: in Node 20 a decoder once asked to stream
 * leaves its fast path for good, and decodes an upstream's chunk of 1 KB in about 1.2 to 1.8 µs against 0.25.
 */
export class Utf8Chunks {
  // The mark is dropped here, once: a decoder that does not stream would drop it at every chunk's start.
  private readonly decoder = new TextDecoder('utf-8', { ignoreBOM: true });
  /** The first bytes of a character the last chunk ended in. */
  private held: Uint8Array | undefined;
  /** Whether text has been produced (a byte-order mark after that is a character). */
  private started = false;

  /** The text `chunk` completes. */
  text(chunk: Uint8Array): string {
    let bytes = chunk;
    if (this.held) {
      bytes = new Uint8Array(this.held.length + chunk.length);
      bytes.set(this.held);
      bytes.set(chunk, this.held.length);
      this.held = undefined;
    }
    const open = incompleteTail(bytes);
    if (open > 0) {
      // A copy: a Node Buffer's `slice` is a view of memory its owner may use again.
      this.held = Uint8Array.from(bytes.subarray(bytes.length - open));
      bytes = bytes.subarray(0, bytes.length - open);
    }
    return this.withoutMark(bytes.length === 0 ? '' : this.decoder.decode(bytes));
  }

  /** At the stream's end: what is held, each incomplete character as U+FFFD. */
  rest(): string {
    const held = this.held;
    this.held = undefined;
    return held ? this.withoutMark(this.decoder.decode(held)) : '';
  }

  private withoutMark(text: string): string {
    if (this.started || text === '') return text;
    this.started = true;
    return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
  }
}

/**
 * How many bytes at the end of `bytes` begin a character that the bytes after them may complete (0 to 3): a
 * lead byte and fewer continuation bytes than it announces. Anything else (ASCII, a whole character, bytes no
 * continuation can make valid) decodes now as it would then.
 */
export function incompleteTail(bytes: Uint8Array): number {
  const n = bytes.length;
  for (let back = 1; back <= 3 && back <= n; back++) {
    const b = bytes[n - back] as number;
    if ((b & 0xc0) === 0x80) continue;
    const length = b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 1;
    return length > back ? back : 0;
  }
  return 0;
}

/** What an event stream's reader carries between chunks: the text not yet cut into lines, the event so far. */
type SseState = { buffer: string; data: string[]; event: string; id: string | undefined };

/**
 * The events completed by the lines in `state.buffer`. At module level, not inside the reader: a generator
 * function made per stream gets an initial map of its own, which V8 keeps in the old generation and which
 * points back at the function and the stream's scope, so every stream read on a server would outlive a
 * scavenge (HISTORY.md, thirteenth round).
 */
function* dispatch(state: SseState, done: boolean): Generator<SseEvent> {
  // A line ends at CRLF, LF or CR; a CR at the very end may be the first half of a CRLF still in transit.
  for (let end = lineEnd(state.buffer, done); end !== -1; end = lineEnd(state.buffer, done)) {
    const buffer = state.buffer;
    const line = buffer.slice(0, end);
    state.buffer = buffer.slice(buffer.startsWith('\r\n', end) ? end + 2 : end + 1);
    if (line === '') {
      if (state.data.length > 0)
        yield {
          event: state.event || 'message',
          data: state.data.join('\n'),
          ...(state.id ? { id: state.id } : {}),
        };
      state.data = [];
      state.event = '';
      continue;
    }
    if (line.startsWith(':')) continue;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') state.data.push(value);
    else if (field === 'event') state.event = value;
    else if (field === 'id' && !value.includes('\0')) state.id = value;
  }
}

function lineEnd(buffer: string, done: boolean): number {
  for (let i = 0; i < buffer.length; i++) {
    const c = buffer.charCodeAt(i);
    if (c === 10) return i;
    if (c === 13) return i + 1 < buffer.length || done ? i : -1;
  }
  return -1;
}

/** Raised when the server reports an error inside a stream that had already started (HTTP status 200). */
export class ServiceStreamError extends Error {
  override readonly name = 'ServiceStreamError';
  readonly type: string;
  readonly code: string | undefined;
  readonly retryAfter: number | undefined;
  constructor(error: ChatCompletionStreamError['error']) {
    super(error.message);
    this.type = error.type;
    this.code = error.code ?? undefined;
    this.retryAfter = error.retry_after ?? undefined;
  }
}

/** Raised when a stream ends without `data: [DONE]`: the answer may be truncated. */
export class IncompleteStreamError extends Error {
  override readonly name = 'IncompleteStreamError';
  constructor() {
    super('The stream ended before data: [DONE]; the answer may be incomplete');
  }
}

/**
 * Yields the `chat.completion.chunk` objects of a chat stream until `data: [DONE]`. An in-band error event
 * throws `ServiceStreamError`; a stream that stops before `[DONE]` throws `IncompleteStreamError`.
 */
export async function* readChatCompletionChunks(
  stream: ReadableStream<Uint8Array>,
): AsyncGenerator<ChatCompletionChunk> {
  for await (const { data } of readSseEvents(stream)) {
    if (data === '[DONE]') return;
    const parsed = JSON.parse(data) as ChatCompletionChunk | ChatCompletionStreamError;
    if ('error' in parsed) throw new ServiceStreamError(parsed.error);
    yield parsed;
  }
  throw new IncompleteStreamError();
}
