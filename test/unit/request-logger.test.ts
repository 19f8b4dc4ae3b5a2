/**
 * A request's own logger (server/app.ts `Locals.log`, a handler's `ctx.log`): its lines carry the request's
 * `CF-RAY` id (`cfRay`), whether a handler logs or the error handler does, and it is made only when a line is
 * logged through it: a request that logs nothing of its own makes no child of the server's logger.
 */
import { afterAll, beforeAll, expect, test, vi } from 'vitest';
import { createLogger } from '../../server/observability/logger.ts';
import { startTestApp, type TestApp } from '../support/app.ts';

const lines: string[] = [];
const logger = createLogger('info', { write: (line: string) => void lines.push(line) });
let app: TestApp;
beforeAll(async () => {
  app = await startTestApp({
    logger,
    handlers: {
      // Logs a line of its own when asked to.
      listImageStyles: async (ctx) => {
        if (ctx.headers['x-test-log']) ctx.log.info({ styles: 2 }, 'styles listed');
        return { status: 200, body: { object: 'list', data: ['a', 'b'] } };
      },
      listModelTraits: async () => {
        throw new Error('traits store unreachable');
      },
    },
  });
});
afterAll(() => app.close());

/** The parsed lines whose `msg` is `msg` and whose `cfRay` is the response's. */
async function linesOf(response: Response, msg: string) {
  await response.arrayBuffer();
  const cfRay = response.headers.get('cf-ray') as string;
  expect(cfRay).toMatch(/^[0-9a-f]{16}-/);
  const parsed = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  await vi.waitFor(() => expect(parsed().some((l) => l.msg === msg && l.cfRay === cfRay)).toBe(true));
  return parsed().filter((l) => l.msg === msg && l.cfRay === cfRay);
}

test("behavior: a handler's lines carry its request's CF-RAY id", async () => {
  const response = await fetch(`${app.url}/image/styles`, { headers: { 'x-test-log': '1' } });
  expect(response.status).toBe(200);
  expect(await linesOf(response, 'styles listed')).toEqual([
    expect.objectContaining({ level: 30, styles: 2 }),
  ]);
});

test("fault: a handler's failure is logged with its request's CF-RAY id, and answered 500", async () => {
  const response = await fetch(`${app.url}/models/traits`);
  expect(response.status).toBe(500);
  const [line] = await linesOf(response, 'request failed');
  expect(line).toMatchObject({
    level: 50,
    path: '/api/v1/models/traits',
    err: { message: 'traits store unreachable' },
  });
});

test('behavior: a request that logs nothing of its own makes no child of the logger', async () => {
  const child = vi.spyOn(logger, 'child');
  try {
    const response = await fetch(`${app.url}/image/styles`);
    expect(response.status).toBe(200);
    await linesOf(response, 'request');
    expect(child).not.toHaveBeenCalled();
  } finally {
    child.mockRestore();
  }
});
