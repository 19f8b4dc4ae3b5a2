/**
 * What a frontend team relies on: through the typed client (contract validation on), the mock answers every
 * named success example of the contract when asked for it by name with `Prefer: example=<name>`, value for
 * value. The names are part of v1 (the breaking-change gate fails on a removed or renamed one), so a screen
 * built on an example keeps working.
 */
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import type { ServiceClient } from '../../client/index.ts';
import { type RunningMock, startMock } from '../../mocks/front.ts';
import { contractValidation, validatingClient } from '../support/client-validation.ts';
import {
  deref,
  exampleJsonBody,
  exampleParams,
  listOperations,
  loadBundle,
  mediaExamples,
  mediaOf,
  type Operation,
} from '../support/contract.ts';

const doc = loadBundle();
const validation = contractValidation(doc, { record: false });
let mock: RunningMock;
let withKey: ServiceClient;
let withWallet: ServiceClient;

beforeAll(async () => {
  mock = await startMock({ port: 0, log: () => {} });
  withKey = validatingClient({ baseUrl: mock.url, apiKey: 'mock-key' }, validation);
  withWallet = validatingClient(
    {
      baseUrl: mock.url,
      signInWithX: Buffer.from(
        JSON.stringify({ address: '0x5268B7a3c9D1e2F4a6B8c0D2e4F6a8B0c2D43999' }),
      ).toString('base64'),
    },
    validation,
  );
});

afterAll(async () => {
  await mock?.close();
});

type Case = { operation: Operation; status: string; name: string; value: unknown };

const cases: Case[] = listOperations(doc).flatMap((operation) =>
  Object.entries(operation.responses)
    .filter(([status]) => status.startsWith('2'))
    .flatMap(([status, response]) =>
      mediaExamples(doc, mediaOf(deref(doc, response), 'application/json')).map((example) => ({
        operation,
        status,
        name: example.name,
        value: example.value,
      })),
    ),
);

function request(operation: Operation): Record<string, unknown> {
  const params = exampleParams(doc, operation);
  const requestBody = operation.requestBody ? deref(doc, operation.requestBody) : undefined;
  if (mediaOf(requestBody, 'multipart/form-data')) {
    const form = new FormData();
    form.append('model', 'openai/whisper-large-v3');
    form.append('file', new Blob(['RIFF'], { type: 'audio/wav' }), 'a.wav');
    return { params, body: form, bodySerializer: (b: unknown) => b };
  }
  const body = exampleJsonBody(doc, operation);
  return { params, ...(body === undefined ? {} : { body }) };
}

describe('the mock serves every named example on request', () => {
  test('behavior: there are named examples to serve', () => {
    expect(cases.length).toBeGreaterThan(40);
  });

  test.each(cases.map((c) => [`${c.operation.operationId} ${c.status} ${c.name}`, c] as const))(
    '%s',
    async (_name, c) => {
      const walletOnly = c.operation.security.every((r) => 'siwx' in r);
      const client = (walletOnly ? withWallet : withKey) as unknown as Record<
        string,
        (path: string, init: unknown) => Promise<{ data?: unknown; response: Response }>
      >;
      const call = client[c.operation.method.toUpperCase()];
      if (!call) throw new Error(`no ${c.operation.method}`);
      const init = request(c.operation);
      const sent = await call(c.operation.path, {
        ...init,
        headers: { Prefer: `example=${c.name}, code=${c.status}` },
      });
      expect(sent.response.status).toBe(Number(c.status));
      expect(sent.data).toEqual(c.value);
    },
  );
});
