/**
 * Idle polling: for a short while after a request arrives while the process serves no other, and after the
 * answer that leaves it serving none, the process keeps its event loop turning (one `setImmediate` after
 * another, so that libuv polls its sockets with a zero timeout) instead of going to sleep in `epoll_wait`.
 * What it buys is the wake-up. On a VM whose idle vCPUs halt at once (this one: the `cpuidle-haltpoll` driver
 * with `guest_halt_poll_ns=0`), a process that sleeps is woken 20 to 40 µs after the packet it waits for
 * arrives, because the host must schedule the halted vCPU again (bench/HISTORY.md, sixteenth round). A
 * proxied request waits twice in this process, for the upstream's answer and, on a kept-alive connection,
 * for the client's next request; a loop still polling sees both at once (both proxies' added p50 about 0.1 ms
 * lower in A/Bs, twenty-first round).
 *
 * It is what a reactor such as Seastar does before it sleeps (`--idle-poll-time-us`; `--overprovisioned`
 * turns it off), and what the guest's own halt-polling would do for the whole machine. The price is CPU: a
 * process serving one request at a time keeps one vCPU busy, and a request arriving alone costs up to twice
 * the window. An idle process polls not at all. `IDLE_POLL_US=0` turns it off (a machine shared with other
 * work, a laptop on battery).
 *
 * The loop polls until `windowUs` has passed since the last such arrival or answer, then waits as before.
 * Long upstream calls (a model's seconds) are waited for asleep; the window covers a fast upstream's round
 * trip and a client's turnaround.
 *
 * Only a request served alone is polled for. With others in flight the loop has their work to do between two
 * waits, and a loop polling through the short gaps that remain takes the CPU that the process's other threads
 * (the checkpointer, V8's compilers and collector) and its neighbours on the machine (the load's own clients)
 * need: 3% fewer chats per second at 16 connections when every request kept the loop polling.
 */
import type { Server } from 'node:http';

// From node:perf_hooks and node:timers, not the globals: fake timers in tests replace the globals.
import { performance } from 'node:perf_hooks';
import { setImmediate } from 'node:timers';
import type { InFlight } from './in-flight.ts';

export type IdlePoll = {
  /** Keeps the loop polling for the window from now (extends a window under way). */
  keep(): void;
  /** Ends the window under way: the loop may sleep from its next turn. */
  rest(): void;
  /** Whether the loop is polling now. */
  polling(): boolean;
  /** Ends the polling for good (the server closed): the loop may go to sleep, and the process exit. */
  stop(): void;
};

/** The default window, in µs (`IDLE_POLL_US`). */
export const IDLE_POLL_US = 500;

/**
 * Polling for `windowUs` after each `keep`; 0 never polls. `now` is a clock in ms (tests give their own;
 * default `performance.now`).
 */
export function idlePoll(windowUs: number, now: () => number = () => performance.now()): IdlePoll {
  const windowMs = windowUs / 1000;
  let until = 0;
  let polling = false;
  let stopped = false;
  const poll = () => {
    if (!stopped && now() < until) setImmediate(poll);
    else polling = false;
  };
  return {
    keep() {
      if (windowMs <= 0 || stopped) return;
      until = now() + windowMs;
      if (polling) return;
      polling = true;
      setImmediate(poll);
    },
    rest() {
      until = 0;
    },
    polling: () => polling,
    stop() {
      stopped = true;
    },
  };
}

/**
 * Polls for `windowUs` after a request arrives while the process serves no other, and after the answer that
 * leaves it serving none has been sent (its response closed), as `inFlight` counts them, until `server`
 * closes. A request that arrives while another is served ends the window. Nothing is watched when `windowUs`
 * is 0. `now` as for `idlePoll`.
 */
export function pollWhileServing(
  server: Server,
  inFlight: InFlight,
  windowUs: number,
  now?: () => number,
): IdlePoll {
  const poll = idlePoll(windowUs, now);
  if (windowUs <= 0) return poll;
  inFlight.watch((serving, arrived) => {
    if (serving === 0 || (arrived && serving === 1)) poll.keep();
    else if (arrived) poll.rest();
  });
  server.once('close', () => poll.stop());
  return poll;
}
