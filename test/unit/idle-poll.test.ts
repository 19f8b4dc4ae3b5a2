import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, test } from 'vitest';
import { idlePoll, pollWhileServing } from '../../server/http/idle-poll.ts';
import { createInFlight } from '../../server/http/in-flight.ts';
import { extend } from '../../server/objects.ts';

/** Resolves after `turns` turns of the event loop (each a check phase the poll's immediates also run in). */
const turns = async (count: number) => {
  for (let n = 0; n < count; n++) await new Promise((resolve) => setImmediate(resolve));
};

describe('idlePoll', () => {
  test('behavior: keeps the loop turning for the window after each keep, then lets it sleep', async () => {
    let clock = 0;
    const poll = idlePoll(500, () => clock);
    expect(poll.polling()).toBe(false);
    poll.keep();
    expect(poll.polling()).toBe(true);
    await turns(5);
    expect(poll.polling()).toBe(true);
    // A keep inside the window extends it from then: 0.4 ms + 0.5 ms.
    clock = 0.4;
    poll.keep();
    clock = 0.6;
    await turns(3);
    expect(poll.polling()).toBe(true);
    clock = 0.9;
    await turns(2);
    expect(poll.polling()).toBe(false);
    // And starts again on the next keep.
    poll.keep();
    expect(poll.polling()).toBe(true);
    clock = 2;
    await turns(2);
    expect(poll.polling()).toBe(false);
  });

  test('behavior: a window of 0 never polls, and a stopped poll ends and does not start again', async () => {
    const clock = 0;
    const off = idlePoll(0, () => clock);
    off.keep();
    expect(off.polling()).toBe(false);

    const poll = idlePoll(1_000_000, () => clock);
    poll.keep();
    await turns(2);
    expect(poll.polling()).toBe(true);
    poll.stop();
    await turns(2);
    expect(poll.polling()).toBe(false);
    poll.keep();
    expect(poll.polling()).toBe(false);
  });
});

describe('pollWhileServing', () => {
  test('behavior: polls after a request served alone arrives and after its answer is sent, until the server closes', async () => {
    let clock = 0;
    let held: (() => void) | undefined;
    const inFlight = createInFlight();
    const server = createServer((req, res) => {
      // As the app's first layer counts every request.
      inFlight.track(res);
      if (req.url === '/held') {
        held = () => res.end(req.url);
        return;
      }
      if (req.url === '/quick') {
        res.end(req.url);
        return;
      }
      // The work takes 10 ms of the test's clock, after the arrival was counted: the arrival's window (0.5 ms)
      // is long over at the answer.
      setImmediate(() => {
        clock += 10;
        res.end(req.url);
      });
    });
    const poll = pollWhileServing(server, inFlight, 500, () => clock);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    const get = (path: string) =>
      new Promise<string>((resolve, reject) => {
        const req = request({ port, path, host: '127.0.0.1' }, (res) => {
          let body = '';
          res.on('data', (chunk: Buffer) => {
            body += chunk.toString();
          });
          res.on('end', () => resolve(body));
        });
        req.on('error', reject);
        req.end();
      });
    /** Whether the loop still polls `ms` of the test's clock later, once its next turns have run. */
    const pollingAfter = async (ms: number) => {
      clock += ms;
      await turns(2);
      return poll.polling();
    };
    try {
      expect(poll.polling()).toBe(false);
      expect(await get('/one')).toBe('/one');
      // Polling since the answer (10 ms + 0.5 ms), not only since the arrival (0 + 0.5 ms).
      expect(poll.polling()).toBe(true);
      expect(await pollingAfter(0.4)).toBe(true);
      expect(await pollingAfter(0.2)).toBe(false);
      expect(await get('/two')).toBe('/two');
      expect(poll.polling()).toBe(true);
      // Polling from the arrival, before any answer.
      expect(await pollingAfter(1)).toBe(false);
      const answer = get('/held');
      while (!held) await new Promise((resolve) => setTimeout(resolve, 1));
      expect(poll.polling()).toBe(true);
      // A request arriving while another is served ends the window, and its answer (one still served) does
      // not start one: only a request served alone is polled for.
      expect(await get('/quick')).toBe('/quick');
      expect(await pollingAfter(0)).toBe(false);
      // The last answer does.
      held?.();
      expect(await answer).toBe('/held');
      await turns(1);
      expect(poll.polling()).toBe(true);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
    await turns(2);
    expect(poll.polling()).toBe(false);
  });

  test('behavior: with a window of 0 the server is left as it was', () => {
    const server = createServer(() => {});
    const before = server.listenerCount('request');
    // Nothing watches the count either.
    const inFlight = extend(createInFlight(), {
      watch() {
        throw new Error('watched with a window of 0');
      },
    });
    const poll = pollWhileServing(server, inFlight, 0);
    expect(server.listenerCount('request')).toBe(before);
    poll.keep();
    expect(poll.polling()).toBe(false);
  });
});
