/**
 * A request's cancellation, whose `AbortSignal` is made only when something reads it.
 *
 * On Node 20 making an `AbortSignal` costs about 3 µs (more under load): Node swaps the new object's prototype
 * after constructing it, which gives every signal a hidden class of its own (bench/HISTORY.md, thirteenth and
 * twenty-third rounds). Most operations never read theirs (the model lists, account reads), and a handler that
 * needs a signal for more than the client leaving (the non-streamed chat's time limit) aborts this one instead
 * of making a second and linking the two.
 */
export class RequestAbort {
  #controller: AbortController | undefined;
  #aborted = false;
  #reason: unknown;

  /** The signal, made at the first read (already aborted when the abort came first). */
  get signal(): AbortSignal {
    let controller = this.#controller;
    if (!controller) {
      controller = new AbortController();
      this.#controller = controller;
      // `abort(undefined)` gives the default reason, an `AbortError`, as a signal aborted at once would have.
      if (this.#aborted) controller.abort(this.#reason);
    }
    return controller.signal;
  }

  /** Whether it was aborted, without making the signal. */
  get aborted(): boolean {
    return this.#aborted;
  }

  /** Aborts the signal (now, or once it is made); only the first abort counts, as an `AbortController`'s. */
  abort(reason?: unknown): void {
    if (this.#aborted) return;
    this.#aborted = true;
    this.#reason = reason;
    this.#controller?.abort(reason);
  }
}
