/**
 * The request validation of every operation is built ahead of the first request (http/validator-warmup.ts):
 * once the app has been warmed, a first request of an operation builds no schema. The control: without the
 * warm-up, the first request builds the operation's two (express-openapi-validator adds each to Ajv on first
 * use).
 */
import { Ajv2020 } from 'ajv/dist/2020.js';
import { afterEach, describe, expect, test, vi } from 'vitest';
import type { ApiKeyPrincipal } from '../../server/http/auth.ts';
import { loadContract } from '../../server/http/spec.ts';
import { startTestApp, type TestApp } from '../support/app.ts';

const principal: ApiKeyPrincipal = {
  kind: 'apiKey',
  accountId: '00000000-0000-4000-8000-000000000001',
  keyId: '00000000-0000-4000-8000-000000000002',
  keyType: 'ADMIN',
};
/** Ajv's own class, which every variant the validator makes extends (`addSchema` is its method). */
const ajvCore = Object.getPrototypeOf(Ajv2020.prototype) as { addSchema(...args: unknown[]): unknown };
const headers = { authorization: 'Bearer test', 'content-type': 'application/json' };
const chat = JSON.stringify({ model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'Hello' }] });

/** The first requests of a few operations, as clients send them (valid or not: validation runs either way). */
async function firstRequests(url: string): Promise<number[]> {
  const sent = [
    fetch(`${url}/chat/completions`, { method: 'POST', headers, body: chat }),
    fetch(`${url}/models`),
    fetch(`${url}/crypto/rpc/base-mainnet`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'eth_blockNumber', params: [] }),
    }),
    fetch(`${url}/api_keys/rate_limits`, { headers: { authorization: 'Bearer test' } }),
    fetch(`${url}/embeddings`, { method: 'POST', headers, body: '{"model": 1}' }),
    // Multipart (its own boundary: the validator's key leaves the boundary out).
    fetch(`${url}/audio/transcriptions`, {
      method: 'POST',
      headers: { authorization: 'Bearer test' },
      body: (() => {
        const form = new FormData();
        form.set('model', 'whisper-large-v3');
        return form;
      })(),
    }),
  ];
  const statuses: number[] = [];
  for (const answer of sent) {
    const response = await answer;
    await response.arrayBuffer();
    statuses.push(response.status);
  }
  return statuses;
}

describe('request validation built at start', () => {
  let app: TestApp | undefined;
  afterEach(async () => {
    vi.restoreAllMocks();
    await app?.close();
    app = undefined;
  });

  test('after the warm-up, the first request of an operation builds no schema', async () => {
    app = await startTestApp({ auth: { authenticateApiKey: async () => principal } });
    const warmed = await app.app.warmRequestValidation();
    expect(warmed.operations).toBe(loadContract().operations.length);
    const added = vi.spyOn(ajvCore, 'addSchema');
    const statuses = await firstRequests(app.url);
    // Validated: the chat passes (its handler is the scaffold's), the embedding's body does not.
    expect(statuses[0]).not.toBe(400);
    expect(statuses[4]).toBe(400);
    expect(added.mock.calls.map((call) => call[1])).toEqual([]);
  });

  test('without it, the first request builds its operation’s schemas (the control)', async () => {
    app = await startTestApp({ auth: { authenticateApiKey: async () => principal } });
    const added = vi.spyOn(ajvCore, 'addSchema');
    const statuses = await firstRequests(app.url);
    expect(statuses[0]).not.toBe(400);
    expect(added.mock.calls.length).toBeGreaterThanOrEqual(2 * statuses.length);
  });
});
