/**
 * The requests this process is serving: counted from the request's arrival to its response's end (or the
 * connection's close). What some decisions depend on (whether an answer waits for its capture) and a gauge.
 */
import type { ServerResponse } from 'node:http';

export type InFlight = {
  /** Requests arrived and not yet answered or abandoned. */
  count(): number;
  /** Counts one request until its response closes. */
  track(res: ServerResponse): void;
};

export function createInFlight(): InFlight {
  let count = 0;
  const done = () => {
    count--;
  };
  return {
    count: () => count,
    track(res) {
      count++;
      // 'close' comes once for every response: after its end, or when its connection went away first.
      res.once('close', done);
    },
  };
}
