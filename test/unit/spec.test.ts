/**
 * Checks of the bundled contract that do not depend on the linter's configuration: the shape every operation
 * must have, the rules of the interface description that must be in the schemas, and every example valid.
 */
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import {
  ContractValidator,
  deref,
  listOperations,
  loadBundle,
  mediaExamples,
  mediaOf,
  type Operation,
  repoRoot,
} from '../support/contract.ts';

const doc = loadBundle();
const validator = new ContractValidator(doc);
const operations = listOperations(doc);
const byId = new Map(operations.map((op) => [op.operationId, op]));
type Json = Record<string, unknown>;

function op(id: string): Operation {
  const found = byId.get(id);
  if (!found) throw new Error(`no operation ${id}`);
  return found;
}

function requestSchema(id: string): Json {
  return mediaOf(deref(doc, op(id).requestBody), 'application/json')?.schema as Json;
}

/** Validates one field value by wrapping it in an otherwise minimal request. */
function fieldErrors(schemaName: string, base: Json, field: string, value: unknown): string[] {
  return validator.validate(validator.schema(schemaName), { ...base, [field]: value });
}

describe('components', () => {
  test('behavior: every component file of spec/ is used, so it reaches the bundle', () => {
    // The bundler drops files nothing refers to, and lint cannot see them: a forgotten header would vanish.
    const missing: string[] = [];
    for (const kind of ['schemas', 'responses', 'parameters', 'headers', 'examples']) {
      const dir = join(repoRoot, 'spec', 'components', kind);
      const files = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.yaml')) : [];
      for (const file of files) {
        const name = file.replace(/\.yaml$/, '');
        if (!doc.components[kind]?.[name]) missing.push(`${kind}/${name}`);
      }
    }
    expect(missing).toEqual([]);
  });
});

describe('info and servers', () => {
  test('behavior: info.version is a service revision YYYYMMDD.HHMMSS', () => {
    expect((doc.info as Json).version).toMatch(/^\d{8}\.\d{6}$/);
  });

  test('behavior: every server URL ends in the /api/v1 base path', () => {
    const servers = doc.servers as { url: string }[];
    expect(servers.length).toBeGreaterThan(0);
    for (const server of servers) expect(new URL(server.url).pathname).toBe('/api/v1');
  });
});

describe('every operation', () => {
  test.each(operations.map((o) => [o.operationId, o] as const))('%s is fully described', (_id, o) => {
    expect(o.operationId).toMatch(
      /^(list|get|create|update|delete|generate|quote|queue|retrieve|complete|call|topUp)[A-Z]/,
    );
    expect(String(o.summary ?? '').length).toBeGreaterThan(3);
    expect(String(o.description ?? '').length).toBeGreaterThan(40);
    expect(o.tags).toHaveLength(1);
    expect(Array.isArray(o.security)).toBe(true);
    // What the server can answer for bad input or load on any operation is declared, so it is never a 500.
    const statuses = Object.keys(o.responses);
    expect(statuses).toEqual(expect.arrayContaining(['400', '429', '500']));
    if (o.requestBody) expect(statuses).toEqual(expect.arrayContaining(['413', '415']));
    if (o.security.some((r) => Object.keys(r).length > 0)) expect(statuses).toContain('401');
    for (const [status, raw] of Object.entries(o.responses)) {
      const response = deref(doc, raw);
      const headers = Object.keys((response.headers as Json) ?? {}).map((h) => h.toLowerCase());
      expect(headers, `${status} headers`).toEqual(expect.arrayContaining(['cf-ray', 'x-service-version']));
      const content = (response.content ?? {}) as Record<string, Json>;
      for (const [media, body] of Object.entries(content)) {
        expect(mediaExamples(doc, body).length, `${status} ${media} has an example`).toBeGreaterThan(0);
        if (!status.startsWith('2')) {
          // Error bodies always carry a string `error`.
          for (const example of mediaExamples(doc, body)) {
            expect(typeof (example.value as Json).error, `${status} ${example.name}`).toBe('string');
          }
        }
      }
    }
    if (o.requestBody) {
      const content = deref(doc, o.requestBody).content as Record<string, Json>;
      for (const body of Object.values(content)) expect(mediaExamples(doc, body).length).toBeGreaterThan(0);
    }
  });
});

describe('every example is valid against its schema', () => {
  const checks: [string, Json, unknown][] = [];
  for (const o of operations) {
    const addMedia = (where: string, content: unknown) => {
      for (const [media, body] of Object.entries((content ?? {}) as Record<string, Json>)) {
        if (!body.schema) continue;
        for (const ex of mediaExamples(doc, body))
          checks.push([`${where} ${media} ${ex.name}`, body.schema as Json, ex.value]);
      }
    };
    if (o.requestBody) addMedia(`${o.operationId} request`, deref(doc, o.requestBody).content);
    for (const [status, raw] of Object.entries(o.responses))
      addMedia(`${o.operationId} ${status}`, deref(doc, raw).content);
    for (const p of o.parameters) {
      if ('example' in p && p.schema)
        checks.push([`${o.operationId} parameter ${p.name}`, p.schema, p.example]);
    }
  }
  for (const [name, schema] of Object.entries(doc.components.schemas ?? {})) {
    for (const [i, ex] of ((schema.examples as unknown[]) ?? []).entries())
      checks.push([`schema ${name} #${i}`, schema, ex]);
  }
  for (const [name, header] of Object.entries(doc.components.headers ?? {})) {
    if ('example' in header) checks.push([`header ${name}`, header.schema as Json, header.example]);
  }

  test('behavior: there are examples to check', () => {
    expect(checks.length).toBeGreaterThan(100);
  });

  test.each(checks)('%s', (_name, schema, value) => {
    expect(validator.validate(schema, value)).toEqual([]);
  });
});

describe('security follows the description', () => {
  test('behavior: catalogue, styles, networks and top-up need no key', () => {
    for (const id of [
      'listModels',
      'listModelTraits',
      'listModelCompatibilityMapping',
      'listImageStyles',
      'listCryptoRpcNetworks',
      'topUpX402Balance',
    ]) {
      const security = op(id).security;
      expect(security.length === 0 || security.some((r) => Object.keys(r).length === 0), id).toBe(true);
    }
  });

  test('behavior: wallet balance and transactions accept the wallet scheme only', () => {
    for (const id of ['getX402Balance', 'listX402Transactions'])
      expect(op(id).security).toEqual([{ siwx: [] }]);
  });

  test('behavior: inference operations accept an API key or a wallet proof', () => {
    for (const id of [
      'createChatCompletion',
      'generateImage',
      'createImage',
      'createEmbedding',
      'createSpeech',
      'createTranscription',
      'queueVideo',
      'retrieveVideo',
      'completeVideo',
      'createDecision',
      'callCryptoRpc',
    ]) {
      expect(op(id).security, id).toEqual([{ BearerAuth: [] }, { siwx: [] }]);
    }
  });

  test('behavior: admin-only operations are marked ADMIN and take a key only', () => {
    const admin = [
      'listApiKeys',
      'createApiKey',
      'updateApiKey',
      'deleteApiKey',
      'getApiKey',
      'listApiKeyRateLimitLogs',
      'getBillingBalance',
      'getBillingUsageHistory',
      'getBillingUsageAnalytics',
    ];
    for (const o of operations) {
      expect(o['x-api-key-type'] === 'ADMIN', o.operationId).toBe(admin.includes(o.operationId));
    }
    for (const id of admin) expect(op(id).security).toEqual([{ BearerAuth: [] }]);
    expect(op('getApiKeyRateLimits').security).toEqual([{ BearerAuth: [] }]);
  });

  test('behavior: the schemes are a bearer token and the SIGN-IN-WITH-X header', () => {
    expect(doc.components.securitySchemes).toMatchObject({
      BearerAuth: { type: 'http', scheme: 'bearer' },
      siwx: { type: 'apiKey', in: 'header', name: 'SIGN-IN-WITH-X' },
    });
  });
});

describe('rules of the description are in the schemas', () => {
  test('behavior: enums of strings stay strings (no YAML 1.1 booleans or sexagesimal numbers)', () => {
    const offenders: string[] = [];
    const visit = (node: unknown, at: string) => {
      if (!node || typeof node !== 'object') return;
      const n = node as Json;
      const types = Array.isArray(n.type) ? n.type : [n.type];
      if (Array.isArray(n.enum) && types.includes('string')) {
        for (const v of n.enum)
          if (typeof v !== 'string' && v !== null) offenders.push(`${at}: ${String(v)}`);
      }
      for (const [k, v] of Object.entries(n)) visit(v, `${at}/${k}`);
    };
    visit(doc, '#');
    expect(offenders).toEqual([]);
    const sp = validator.schema('ChatServiceParameters');
    expect(((sp.properties as Json).enable_web_search as Json).enum).toEqual(['off', 'on', 'auto']);
  });

  const chatBase = { model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'hi' }] };
  test.each([
    ['frequency_penalty', 2, true],
    ['frequency_penalty', 2.01, false],
    ['frequency_penalty', -2.5, false],
    ['max_temp', 2, true],
    ['max_temp', 2.5, false],
    ['top_logprobs', -1, false],
    ['top_logprobs', 3, true],
    ['max_tokens', 0, true],
    ['max_tokens', -5, true],
    ['messages', [], false],
    ['messages', [{ role: 'user', content: [{ type: 'text', text: '' }] }], false],
    [
      'messages',
      [
        {
          role: 'user',
          content: [{ type: 'text', text: 'x', cache_control: { type: 'ephemeral', ttl: '1h' } }],
        },
      ],
      true,
    ],
    [
      'messages',
      [{ role: 'user', content: [{ type: 'text', text: 'x', cache_control: { type: 'persistent' } }] }],
      false,
    ],
    ['service_parameters', { enable_web_search: 'auto', strip_thinking_response: true }, true],
    ['service_parameters', { enable_web_search: true }, false],
    ['unlisted_field_passed_through', 1, true],
  ])('chat %s = %j valid: %s', (field, value, valid) => {
    expect(fieldErrors('ChatCompletionRequest', chatBase, field, value).length === 0).toBe(valid);
  });

  const imageBase = { model: 'z-image-turbo', prompt: 'a lighthouse' };
  test.each([
    ['prompt', '', false],
    ['prompt', 'x'.repeat(7500), true],
    ['prompt', 'x'.repeat(7501), false],
    ['negative_prompt', 'x'.repeat(7501), false],
    ['width', 1280, true],
    ['width', 1281, false],
    ['height', 0, false],
    ['cfg_scale', 0, false],
    ['cfg_scale', 20, true],
    ['cfg_scale', 20.5, false],
    ['seed', -999999999, true],
    ['seed', 1000000000, false],
    ['variants', 4, true],
    ['variants', 5, false],
    ['lora_strength', 101, false],
    ['anon_user_id', 'user-42', true],
    ['anon_user_id', 'a||b', false],
    ['anon_user_id', 'a|b', true],
    ['anon_user_id', 'caf\u00e9', false],
    ['anon_user_id', 'x'.repeat(129), false],
    ['format', 'gif', false],
    ['quality', 'ultra', false],
    ['resolution', '2K', true],
    ['not_a_field', 1, false],
  ])('image %s = %j valid: %s', (field, value, valid) => {
    expect(fieldErrors('ImageGenerateRequest', imageBase, field, value).length === 0).toBe(valid);
  });

  test('behavior: variants above 1 are refused together with return_binary', () => {
    expect(
      validator.validate(validator.schema('ImageGenerateRequest'), {
        ...imageBase,
        variants: 2,
        return_binary: true,
      }),
    ).not.toEqual([]);
    expect(
      validator.validate(validator.schema('ImageGenerateRequest'), {
        ...imageBase,
        variants: 2,
        return_binary: false,
      }),
    ).toEqual([]);
  });

  test('behavior: embeddings take a string or strings, never token ids', () => {
    const schema = requestSchema('createEmbedding');
    const base = { model: 'text-embedding-bge-m3' };
    expect(validator.validate(schema, { ...base, input: 'hello' })).toEqual([]);
    expect(validator.validate(schema, { ...base, input: ['a', 'b'] })).toEqual([]);
    expect(validator.validate(schema, { ...base, input: [1, 2, 3] })).not.toEqual([]);
    expect(validator.validate(schema, { ...base, input: [[1, 2]] })).not.toEqual([]);
  });

  test('behavior: wallet addresses are EVM or Solana', () => {
    const schema = validator.schema('WalletAddress');
    expect(validator.validate(schema, '0x5268B7a3c9D1e2F4a6B8c0D2e4F6a8B0c2D43999')).toEqual([]);
    expect(validator.validate(schema, '7xKXtg2CW87d97TXJSDpbD5jBkheTqA83TZRuJosgAsU')).toEqual([]);
    expect(validator.validate(schema, '0x5268B7a3c9D1e2F4a6B8c0D2e4F6a8B0c2D4399')).not.toEqual([]);
    expect(validator.validate(schema, '0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl0OIl')).not.toEqual([]);
  });

  test('behavior: Idempotency-Key is [A-Za-z0-9_-]{1,255}', () => {
    const param = deref(doc, doc.components.parameters?.IdempotencyKey);
    const schema = param.schema as Json;
    expect(validator.validate(schema, 'rpc_retry-01')).toEqual([]);
    expect(validator.validate(schema, 'x'.repeat(255))).toEqual([]);
    expect(validator.validate(schema, 'x'.repeat(256))).not.toEqual([]);
    expect(validator.validate(schema, 'has space')).not.toEqual([]);
    expect(validator.validate(schema, '')).not.toEqual([]);
  });

  test('behavior: an RPC body is one request or a batch of at most 100', () => {
    const schema = requestSchema('callCryptoRpc');
    const item = { jsonrpc: '2.0', method: 'eth_blockNumber', params: [], id: 1 };
    expect(validator.validate(schema, item)).toEqual([]);
    expect(
      validator.validate(
        schema,
        Array.from({ length: 100 }, (_, i) => ({ ...item, id: i })),
      ),
    ).toEqual([]);
    expect(
      validator.validate(
        schema,
        Array.from({ length: 101 }, (_, i) => ({ ...item, id: i })),
      ),
    ).not.toEqual([]);
    expect(validator.validate(schema, [])).not.toEqual([]);
  });

  test('behavior: the validation details tree nests _errors per field', () => {
    const schema = validator.schema('DetailedError');
    expect(
      validator.validate(schema, {
        error: 'x',
        details: { _errors: [], messages: { _errors: [], 0: { role: { _errors: ['bad'] }, _errors: [] } } },
      }),
    ).toEqual([]);
    expect(validator.validate(schema, { error: 'x', details: { field: { _errors: ['bad'] } } })).not.toEqual(
      [],
    );
  });

  test('behavior: the three 402 variants are all accepted by the inference 402 body', () => {
    const response = validator.response(op('createChatCompletion'), 402);
    const media = mediaOf(response, 'application/json');
    const names = mediaExamples(doc, media).map((e) => e.name);
    expect(names.length).toBeGreaterThanOrEqual(3);
    const headers = Object.keys(response?.headers as Json);
    expect(headers).toContain('PAYMENT-REQUIRED');
    const discovery = mediaExamples(doc, media).find((e) => (e.value as Json).x402Version === 2)
      ?.value as Json;
    expect(discovery).toMatchObject({ resource: expect.any(Object), accepts: expect.any(Array) });
    expect((discovery.extensions as Json)['sign-in-with-x']).toBeDefined();
    const wallet = mediaExamples(doc, media).find(
      (e) => (e.value as Json).code === 'PAYMENT_REQUIRED',
    )?.value;
    expect(wallet).toMatchObject({
      topUpInstructions: expect.any(Object),
      siwxChallenge: expect.any(Object),
    });
    expect(mediaExamples(doc, media).some((e) => (e.value as Json).code === 'INSUFFICIENT_BALANCE')).toBe(
      true,
    );
  });

  test('behavior: RPC 429 names the cap in customMessage', () => {
    const response = validator.response(op('callCryptoRpc'), 429);
    const schema = mediaOf(response, 'application/json')?.schema as Json;
    expect(validator.validate(schema, { error: 'Rate limit exceeded' })).not.toEqual([]);
    expect(
      validator.validate(schema, { error: 'Rate limit exceeded', customMessage: '100 requests per minute' }),
    ).toEqual([]);
  });
});

describe('headers of the description are declared where they apply', () => {
  const headersOf = (id: string, status: number) =>
    Object.keys((validator.response(op(id), status)?.headers as Json) ?? {}).map((h) => h.toLowerCase());

  test.each([
    [
      'createChatCompletion',
      200,
      [
        'x-balance-remaining',
        'content-encoding',
        'x-service-model-id',
        'x-service-model-deprecation-warning',
        'x-service-model-deprecation-date',
        'x-service-balance-usd',
        'x-service-balance-diem',
        'x-ratelimit-remaining-requests',
        'x-ratelimit-remaining-tokens',
      ],
    ],
    ['generateImage', 200, ['x-service-enhanced-prompt', 'x-service-is-blurred', 'x-balance-remaining']],
    [
      'callCryptoRpc',
      200,
      ['x-service-rpc-credits', 'x-service-rpc-cost-usd', 'x-request-id', 'idempotent-replayed'],
    ],
    ['callCryptoRpc', 429, ['x-ratelimit-limit', 'x-ratelimit-remaining', 'x-ratelimit-reset']],
    ['topUpX402Balance', 200, ['payment-response']],
    ['topUpX402Balance', 402, ['payment-required']],
    ['getBillingUsageHistory', 200, ['content-disposition', 'x-pagination-total']],
  ] as const)('%s %i declares %j', (id, status, expected) => {
    expect(headersOf(id, status)).toEqual(expect.arrayContaining([...expected]));
  });
});
