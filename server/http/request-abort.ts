/**
 * A request's cancellation, whose `AbortSignal` is made only when something reads it, and which the hot paths
 * read without one (`AbortLike`).
 *
 * On Node 20 making an `AbortSignal` is dear: Node swaps the new object's prototype after constructing it, so
 * every signal gets hidden classes of its own, and each property Node then stores on it makes another (V8's
 * `KeyedStoreIC_Slow` and `Map::CopyWithField` under `createAbortSignal`). One signal fewer took 41,000 to
 * 55,000 instructions off a request in most measurements (bench/HISTORY.md, thirteenth and twenty-third
 * rounds). Most operations never read a signal (the model lists, account reads); the chat and the JSON-RPC
 * proxy only ask whether the request was aborted and listen for it, which `RequestAbort` answers itself. A real
 * signal is still made for whatever needs one (`fetch`, `AbortSignal.any`), at its first read.
 */

/**
 * What the hot paths read of an abort: an `AbortSignal` has all of it, and so has a `RequestAbort` without
 * making one. Listeners are told once, without an event.
 */
export type AbortLike = {
  readonly aborted: boolean;
  readonly reason: unknown;
  throwIfAborted(): void;
  addEventListener(type: 'abort', listener: () => void, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: () => void): void;
};

export class RequestAbort implements AbortLike {
  #controller: AbortController | undefined;
  #aborted = false;
  #reason: unknown;
  #listeners: Array<() => void> | undefined;

  /** The signal, made at the first read (already aborted when the abort came first). */
  get signal(): AbortSignal {
    let controller = this.#controller;
    if (!controller) {
      controller = new AbortController();
      this.#controller = controller;
      if (this.#aborted) controller.abort(this.#reason);
    }
    return controller.signal;
  }

  get aborted(): boolean {
    return this.#aborted;
  }

  /** Why it was aborted (an `AbortError` when no reason was given, as an `AbortSignal`'s). */
  get reason(): unknown {
    return this.#reason;
  }

  throwIfAborted(): void {
    if (this.#aborted) throw this.#reason;
  }

  /** Listeners are told once whether or not `once` is given: an abort happens once. */
  addEventListener(_type: 'abort', listener: () => void, _options?: { once?: boolean }): void {
    if (this.#aborted) return;
    let listeners = this.#listeners;
    if (!listeners) {
      listeners = [];
      this.#listeners = listeners;
    }
    // Once, as `EventTarget` adds a listener it already has.
    if (!listeners.includes(listener)) listeners.push(listener);
  }

  removeEventListener(_type: 'abort', listener: () => void): void {
    const listeners = this.#listeners;
    const at = listeners ? listeners.indexOf(listener) : -1;
    if (at >= 0) listeners?.splice(at, 1);
  }

  /**
   * Aborts: the listeners are told in the order they were added, then the signal if one was made. Only the
   * first abort counts, as an `AbortController`'s. A listener that throws does not keep the others from being
   * told; its error is thrown on its own, as `EventTarget` reports one.
   */
  abort(reason?: unknown): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#reason =
      reason === undefined ? new DOMException('This operation was aborted', 'AbortError') : reason;
    const listeners = this.#listeners;
    this.#listeners = undefined;
    for (const listener of listeners ?? []) {
      try {
        listener();
      } catch (error) {
        process.nextTick(() => {
          throw error;
        });
      }
    }
    this.#controller?.abort(this.#reason);
  }
}
