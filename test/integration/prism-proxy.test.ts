/**
 * The Prism validation proxy that the `proxy` project puts in front of the server really catches a response
 * that breaks the contract (so a green proxy run means something).
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { startPrism } from '../../mocks/prism.ts';
import { startTestApp, type TestApp } from '../support/app.ts';
import { repoRoot } from '../support/contract.ts';
import { isAlive } from '../support/process.ts';

describe('Prism validation proxy', () => {
  let app: TestApp;
  let prism: Awaited<ReturnType<typeof startPrism>>;
  beforeAll(async () => {
    app = await startTestApp({
      // Our own response validation off, so the broken body leaves the server.
      env: { VALIDATE_RESPONSES: 'false' },
      handlers: {
        // `object` must be "list" and `data` an array: both wrong.
        listModels: async () => ({ status: 200, body: { object: 'lists', data: 'none' } as never }),
        listModelTraits: async () => ({
          status: 200,
          body: { object: 'list', type: 'text', data: { default: 'llama-3.3-70b' } },
        }),
      },
    });
    prism = await startPrism({
      mode: 'proxy',
      specPath: join(repoRoot, 'generated', 'openapi.yaml'),
      host: '127.0.0.1',
      upstream: app.url,
      args: ['--validate-request', 'false', '-v', 'error'],
    });
  });
  afterAll(async () => {
    await prism?.stop();
    await app?.close();
  });

  test('behavior: a response that violates the contract becomes a 500 listing the violations', async () => {
    const response = await fetch(`${prism.url}/models`);
    expect(response.status).toBe(500);
    const body = (await response.json()) as { type: string; validation: { location: string[] }[] };
    expect(body.type).toContain('VIOLATIONS');
    expect(body.validation.map((v) => v.location.join('.'))).toEqual(
      expect.arrayContaining(['response.body.object', 'response.body.data']),
    );
  });

  test('behavior: a valid response passes through unchanged, and the proxy stops by its pid', async () => {
    const response = await fetch(`${prism.url}/models/traits`);
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({
      object: 'list',
      type: 'text',
      data: { default: 'llama-3.3-70b' },
    });
    await prism.stop();
    expect(isAlive(prism.pid)).toBe(false);
  });
});
