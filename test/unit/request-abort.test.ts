/** server/http/request-abort.ts: a request's cancellation whose signal is made at its first read. */
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
  });

  test("behavior: an abort without a reason gives an AbortError, as an AbortController's does, read before or after", () => {
    const early = new RequestAbort();
    early.abort();
    const late = new RequestAbort();
    const read = late.signal;
    late.abort();
    for (const signal of [early.signal, read]) {
      expect(signal.reason).toBeInstanceOf(DOMException);
      expect((signal.reason as DOMException).name).toBe('AbortError');
    }
  });
});
