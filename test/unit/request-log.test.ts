/**
 * Each response's log line (server/app.ts): written by a child of the logger without its redaction, it has
 * the bytes the redacting logger would have written for it (its fields are primitives none of whose names the
 * logger redacts, observability/logger.ts), and it says which request it was: the `CF-RAY` id, method, path,
 * status, operation and duration.
 */
import { afterAll, beforeAll, expect, test, vi } from 'vitest';
import { createLogger } from '../../server/observability/logger.ts';
import { startTestApp, type TestApp } from '../support/app.ts';

const lines: string[] = [];
const logger = createLogger('info', { write: (line: string) => void lines.push(line) });
let app: TestApp;
beforeAll(async () => {
  app = await startTestApp({ logger });
});
afterAll(() => app.close());

test("behavior: a response's line names its request, with the bytes the redacting logger writes for it", async () => {
  const response = await fetch(`${app.url}/models?type=text`, {
    headers: { authorization: 'Bearer svc_secret_never_logged' },
  });
  await response.arrayBuffer();
  const cfRay = response.headers.get('cf-ray') as string;
  await vi.waitFor(() => expect(lines.some((l) => l.includes(cfRay))).toBe(true));
  const line = lines.find((l) => l.includes(cfRay)) as string;
  const fields = JSON.parse(line) as Record<string, unknown>;
  expect(fields).toMatchObject({
    level: 30,
    cfRay,
    method: 'GET',
    path: '/api/v1/models',
    status: response.status,
    operation: 'listModels',
    msg: 'request',
  });
  expect(fields.ms).toEqual(expect.any(Number));
  // The redacting logger's child, as the app used to write it: the same bytes but for the time.
  const { level: _, time, pid: __, hostname: ___, cfRay: ____, msg: _____, ...rest } = fields;
  const before = lines.length;
  logger.child({ cfRay }).info(rest, 'request');
  const redacted = (lines[before] as string).replace(/"time":\d+/, `"time":${time}`);
  expect(line).toBe(redacted);
  expect(lines.join('')).not.toContain('svc_secret_never_logged');
});
