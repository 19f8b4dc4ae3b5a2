/**
 * The main journeys as Arazzo workflows (test/workflows/), run by Redocly Respect against the real server:
 * Respect checks every step's status and response schema against the contract, the workflows check the
 * journey (charges, replays, balances).
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, test } from 'vitest';
import { type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { runWorkflows } from '../support/respect.ts';
import { type StartedServer, startServer, TEST_ADMIN_KEY } from '../support/server.ts';

const scratch = mkdtempSync(join(tmpdir(), 'workflows-'));
let anvil: StartedAnvil;
let server: StartedServer;
let databases = 0;

beforeAll(async () => {
  anvil = await startAnvil();
});

// Each journey starts from a fresh database: its checks count ledger entries.
beforeEach(async () => {
  server = await startServer(
    `sqlite:${join(scratch, `workflows-${++databases}.db`)}`,
    { RPC_UPSTREAM_BASE_MAINNET: anvil.url },
    { proxy: false },
  );
});

afterEach(async () => {
  await server?.close();
});

afterAll(async () => {
  await anvil?.stop();
  rmSync(scratch, { recursive: true, force: true });
});

describe('workflows (Redocly Respect) against the real server', () => {
  test('behavior: an image is generated in each format (PNG, JPEG, WebP)', async () => {
    const result = await runWorkflows('images.arazzo.yaml', {
      server: server.directBase,
      inputs: { apiKey: TEST_ADMIN_KEY },
    });
    expect(result.failedSteps, result.output).toEqual([]);
    expect(result.passedSteps).toEqual(['png', 'jpeg', 'webp']);
    expect(result.code, result.output).toBe(0);
  });

  test('behavior: a new API key makes a chat call and sees the charge in billing', async () => {
    const result = await runWorkflows('api-key-chat.arazzo.yaml', {
      server: server.directBase,
      inputs: { apiKey: TEST_ADMIN_KEY },
    });
    expect(result.failedSteps, result.output).toEqual([]);
    expect(result.passedSteps).toEqual(['createKey', 'chat', 'billing']);
    expect(result.code, result.output).toBe(0);
  });

  test('behavior: an RPC call replayed with its idempotency key is answered from the store and charged once', async () => {
    const result = await runWorkflows('rpc-idempotency.arazzo.yaml', {
      server: server.directBase,
      inputs: { apiKey: TEST_ADMIN_KEY, idempotencyKey: 'workflow-rpc-1' },
    });
    expect(result.failedSteps, result.output).toEqual([]);
    expect(result.passedSteps).toEqual(['historyBefore', 'firstCall', 'replay', 'historyAfter']);
    expect(result.code, result.output).toBe(0);
  });
});
