/**
 * server/http/request-abort.ts: a request's cancellation, whose signal is made at its first read, and which
 * tells its own listeners without one. Its listeners and its signal's are told of the same abort.
 */
import { describe, expect, test } from 'vitest';
import { RequestAbort } from '../../server/http/request-abort.ts';

describe('RequestAbort', () => {
  test('behavior: a signal read before the abort is aborted once, with its listeners told once', () => {
    const cancel = new RequestAbort();
    const signal = cancel.signal;
    expect(cancel.signal).toBe(signal);
    expect(signal.aborted).toBe(false);
    expect(cancel.aborted).toBe(false);
    let told = 0;
    signal.addEventListener('abort', () => told++);
    const reason = new Error('time limit');
    cancel.abort(reason);
    cancel.abort(new Error('second'));
    expect(told).toBe(1);
    expect(signal.aborted).toBe(true);
    expect(signal.reason).toBe(reason);
    expect(cancel.aborted).toBe(true);
    expect(cancel.reason).toBe(reason);
  });

  test('behavior: a signal first read after the abort is already aborted, with the first reason', () => {
    const cancel = new RequestAbort();
    const reason = new Error('gone');
    cancel.abort(reason);
    cancel.abort(new Error('second'));
    expect(cancel.aborted).toBe(true);
    const signal = cancel.signal;
    expect(signal.aborted).toBe(true);
    expect(signal.reason).toBe(reason);
    expect(() => signal.throwIfAborted()).toThrow(reason);
    expect(() => cancel.throwIfAborted()).toThrow(reason);
  });

  test('behavior: an abort without a reason gives an AbortError, as an AbortController does, read before or after', () => {
    const early = new RequestAbort();
    early.abort();
    const late = new RequestAbort();
    const read = late.signal;
    late.abort();
    for (const [cancel, signal] of [
      [early, early.signal],
      [late, read],
    ] as const) {
      expect(signal.reason).toBeInstanceOf(DOMException);
      expect((signal.reason as DOMException).name).toBe('AbortError');
      expect(cancel.reason).toBe(signal.reason);
      expect(() => cancel.throwIfAborted()).toThrow(DOMException);
    }
  });

  test('behavior: its own listeners are told once, in order, without a signal; a removed one is not; none after', () => {
    const cancel = new RequestAbort();
    const told: string[] = [];
    const first = () => told.push('first');
    const removed = () => told.push('removed');
    const second = () => told.push('second');
    cancel.addEventListener('abort', first);
    cancel.addEventListener('abort', first);
    cancel.addEventListener('abort', removed, { once: true });
    cancel.addEventListener('abort', second);
    cancel.removeEventListener('abort', removed);
    cancel.removeEventListener('abort', () => {});
    expect(cancel.aborted).toBe(false);
    expect(() => cancel.throwIfAborted()).not.toThrow();
    cancel.abort();
    cancel.abort();
    expect(told).toEqual(['first', 'second']);
    cancel.addEventListener('abort', () => told.push('late'));
    expect(told).toEqual(['first', 'second']);
  });

  test("behavior: its listeners and its signal's hear the same abort; a listener that throws keeps none from being told", async () => {
    const cancel = new RequestAbort();
    const told: string[] = [];
    cancel.addEventListener('abort', () => {
      throw new Error('listener failed');
    });
    cancel.addEventListener('abort', () => told.push('own'));
    cancel.signal.addEventListener('abort', () => told.push('signal'));
    const thrown = new Promise<unknown>((resolve) => process.once('uncaughtException', resolve));
    cancel.abort('gone');
    expect(told).toEqual(['own', 'signal']);
    expect(cancel.signal.reason).toBe('gone');
    expect(((await thrown) as Error).message).toBe('listener failed');
  });
});
