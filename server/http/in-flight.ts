/**
 * The requests this process is serving: counted from the request's arrival to its response's end (or the
 * connection's close). What a decision depends on (whether the event loop polls) and a gauge.
 */
import type { ServerResponse } from 'node:http';

/** Told of each change of the count: the count after it, and whether a request arrived (or one ended). */
export type InFlightWatcher = (count: number, arrived: boolean) => void;

export type InFlight = {
  /** Requests arrived and not yet answered or abandoned. */
  count(): number;
  /** Counts one request until its response closes. */
  track(res: ServerResponse): void;
  /** Sets the one watcher of the count (idle polling, http/idle-poll.ts). */
  watch(watcher: InFlightWatcher): void;
};

export function createInFlight(): InFlight {
  let count = 0;
  let watcher: InFlightWatcher | undefined;
  const done = () => {
    count--;
    watcher?.(count, false);
  };
  return {
    count: () => count,
    track(res) {
      count++;
      watcher?.(count, true);
      // 'close' comes once for every response: after its end, or when its connection went away first.
      res.once('close', done);
    },
    watch(next) {
      watcher = next;
    },
  };
}
