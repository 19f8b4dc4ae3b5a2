import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, expect, test } from 'vitest';
import { createInFlight } from '../../server/http/in-flight.ts';

describe('createInFlight', () => {
  test('behavior: counts each request from its arrival to its response’s end, or to its client going away', async () => {
    const inFlight = createInFlight();
    const seen: number[] = [];
    let finishSlow = () => {};
    const server = createServer((req, res) => {
      inFlight.track(res);
      seen.push(inFlight.count());
      if (req.url === '/slow') finishSlow = () => res.end('slow');
      else if (req.url !== '/abandoned') res.end('fast');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const port = (server.address() as AddressInfo).port;
    const get = (path: string) =>
      new Promise<{ status: number; destroy(): void }>((resolve, reject) => {
        const req = request({ port, path, host: '127.0.0.1' }, (res) => {
          res.resume();
          res.on('end', () => resolve({ status: res.statusCode ?? 0, destroy: () => req.destroy() }));
        });
        req.on('error', reject);
        req.end();
      });
    try {
      const slow = get('/slow');
      while (seen.length < 1) await new Promise((resolve) => setTimeout(resolve, 5));
      expect(inFlight.count()).toBe(1);
      expect((await get('/fast')).status).toBe(200);
      expect(seen).toEqual([1, 2]);
      expect(inFlight.count()).toBe(1);
      // A request whose client leaves before any answer is no longer counted once its connection closes.
      const abandoned = request({ port, path: '/abandoned', host: '127.0.0.1' });
      abandoned.on('error', () => {});
      abandoned.end();
      while (seen.length < 3) await new Promise((resolve) => setTimeout(resolve, 5));
      expect(inFlight.count()).toBe(2);
      abandoned.destroy();
      while (inFlight.count() > 1) await new Promise((resolve) => setTimeout(resolve, 5));
      finishSlow();
      expect((await slow).status).toBe(200);
      expect(inFlight.count()).toBe(0);
    } finally {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
