/**
 * `npm run mock`: serves the whole contract on MOCK_PORT (default 4010) with Prism, plus real SSE streams for
 * streamed chat. Configuration (all optional): MOCK_PORT, MOCK_HOST (default 127.0.0.1), MOCK_FRAME_DELAY_MS
 * (pause between streamed frames, default 40).
 */
import { startMock } from './front.ts';

function intFromEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isInteger(value) || value < 0 || value > 65_535) {
    console.error(`${name} must be an integer from 0 to 65535, got "${raw}"`);
    process.exit(2);
  }
  return value;
}

const mock = await startMock({
  port: intFromEnv('MOCK_PORT', 4010),
  host: process.env.MOCK_HOST || '127.0.0.1',
  frameDelayMs: intFromEnv('MOCK_FRAME_DELAY_MS', 40),
});
console.log(`Mock server listening on ${mock.url} (Prism pid ${mock.prismPid})`);

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.on(signal, () => {
    if (stopping) return;
    stopping = true;
    void mock.close().then(() => process.exit(0));
  });
}
