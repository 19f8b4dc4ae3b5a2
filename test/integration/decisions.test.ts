/**
 * `POST /decisions` through the real server: the three kinds of question answered by the local chat engine
 * (contract-valid, deterministic for the same request), usage reported and billed per token through the ledger,
 * the request rules (model type, state size, question shapes, credentials), and an OpenAI-compatible upstream:
 * another instance's chat model answers, and an upstream whose answer has the wrong shape is a 500 that charges
 * nothing.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import type { DecisionResponse } from '../../generated/api.d.ts';
import { parseUsdToNano } from '../../server/money.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';
import { ContractValidator, loadBundle } from '../support/contract.ts';

const validator = new ContractValidator(loadBundle());
const responseSchema = validator.schema('DecisionResponse');

const ticket = {
  model: 'jev-latest',
  state:
    'Support ticket #4812: "I was charged twice for my November invoice and nobody has answered my two emails. Please give me my money back today."',
  questions: {
    wants_refund: {
      type: 'noul',
      instructions: 'The customer is asking for a refund.',
      criteria: { true: 'The customer asks for money back.', false: 'The customer only reports a problem.' },
    },
    team: {
      type: 'choice',
      instructions: 'Which team should handle this ticket?',
      criteria: { billing: 'Payments and refunds.', technical: 'Errors and outages.', account: null },
    },
    urgency: {
      type: 'score',
      instructions: 'How urgently does the customer need an answer?',
      criteria: ['Can wait a week', 'This week', 'Today', 'Within the hour'],
    },
  },
};

let server: ChatServer;
let upstream: ChatServer;
let broken: Server;

const decide = (body: unknown, key?: string, target: ChatServer = server) =>
  fetch(`${target.base}/decisions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify(body),
  });

/** A loopback "OpenAI-compatible" upstream whose function call has negative weights. */
function brokenUpstream(req: import('node:http').IncomingMessage, res: import('node:http').ServerResponse) {
  req.resume();
  req.on('end', () => {
    const chunk = (delta: unknown, extra: Record<string, unknown> = {}) =>
      `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta, finish_reason: null }], ...extra })}\n\n`;
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(
      chunk({
        tool_calls: [
          {
            index: 0,
            id: 'call_1',
            type: 'function',
            function: { name: 'answer_questions', arguments: '{"q":{"true":-1,"false":2}}' },
          },
        ],
      }),
    );
    res.write(
      `data: ${JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [], usage: { prompt_tokens: 50, completion_tokens: 9, total_tokens: 59 } })}\n\n`,
    );
    res.end('data: [DONE]\n\n');
  });
}

const decisionModel = (provider: unknown) => ({
  type: 'decision',
  created: 1767225600,
  provider,
  rateLimits: {
    paid: { requestsPerMinute: 100, tokensPerMinute: 1000000 },
    partner: { requestsPerMinute: 400, tokensPerMinute: 4000000 },
  },
  maxConcurrency: 16,
  model_spec: {
    name: 'Relay decisions',
    description: 'Decisions answered by an upstream chat model.',
    modelSource: 'upstream',
    privacy: 'private',
    offline: false,
    pricing: { input: '0.042', output: '0' },
    constraints: { maxStateTokens: 32000, maxTotalTokens: 64000 },
  },
});

beforeAll(async () => {
  upstream = await startChatServer();
  const upstreamAccount = await upstream.account('10');
  broken = createServer(brokenUpstream).listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => broken.once('listening', () => resolve()));
  const brokenBase = `http://127.0.0.1:${(broken.address() as AddressInfo).port}/v1`;
  server = await startChatServer({
    env: { DECISION_UPSTREAM_KEY: upstreamAccount.key },
    catalogYaml: stringify({
      models: {
        'relay-decider': decisionModel({
          kind: 'openai-compatible',
          name: 'relay',
          baseUrl: upstream.base,
          apiKeyEnv: 'DECISION_UPSTREAM_KEY',
          upstreamModel: 'llama-3.3-70b',
        }),
        'broken-decider': decisionModel({ kind: 'openai-compatible', name: 'broken', baseUrl: brokenBase }),
      },
    }),
  });
});

afterAll(async () => {
  await server?.close();
  await upstream?.close();
  broken?.closeAllConnections();
  await new Promise<void>((resolve) => (broken ? broken.close(() => resolve()) : resolve()));
});

describe('createDecision', () => {
  test('behavior: noul, choice and score answers are contract-valid, consistent and deterministic', async () => {
    const { key } = await server.account('1');
    const res = await decide(ticket, key);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-service-model-id')).toBe('jev-latest');
    const body = (await res.json()) as DecisionResponse;
    expect(validator.validate(responseSchema, body)).toEqual([]);
    expect(Object.keys(body.answers).sort()).toEqual(['team', 'urgency', 'wants_refund']);

    const noul = body.answers.wants_refund;
    expect(noul?.type).toBe('noul');
    const choice = body.answers.team;
    if (choice?.type !== 'choice') throw new Error('choice answer expected');
    expect(Object.keys(choice.probabilities)).toEqual(['billing', 'technical', 'account']);
    const choiceSum = Object.values(choice.probabilities).reduce((a, b) => a + b, 0);
    expect(choiceSum).toBeCloseTo(1, 3);
    expect(choice.confidence).toBe(Math.max(...Object.values(choice.probabilities)));
    expect(choice.probabilities[choice.choice]).toBe(choice.confidence);

    const score = body.answers.urgency;
    if (score?.type !== 'score') throw new Error('score answer expected');
    expect(score.legend).toEqual({
      '0': 'Can wait a week',
      '1': 'This week',
      '2': 'Today',
      '3': 'Within the hour',
    });
    expect(Object.keys(score.probabilities)).toEqual(['0', '1', '2', '3']);
    expect(score.probabilities[String(score.score)]).toBe(score.confidence);
    expect(body.usage.input_tokens).toBeGreaterThan(50);
    expect(body.usage.output_tokens).toBeGreaterThan(0);

    const again = (await (await decide(ticket, key)).json()) as DecisionResponse;
    expect(again.answers).toEqual(body.answers);
  });

  test('behavior: billed like chat: input tokens at the model price, a CHARGE entry, nothing left reserved', async () => {
    const { accountId, key } = await server.account('1');
    const body = (await (await decide(ticket, key)).json()) as DecisionResponse;
    const entries = await server.services.ledger.listEntries(accountId);
    const charges = entries.filter((e) => e.type === 'CHARGE');
    expect(charges).toHaveLength(1);
    expect(charges[0]).toMatchObject({ sku: 'decision.input_tokens', modelId: 'jev-latest' });
    // $0.042 per million input tokens = 42 nano-USD per token; output is free.
    expect(charges[0]?.amountNano).toBe(-BigInt(body.usage.input_tokens) * 42n);
    const balance = await server.services.ledger.getBalance(accountId);
    expect(balance.usdNano).toBe(parseUsdToNano('1') - BigInt(body.usage.input_tokens) * 42n);
    expect(balance.usdReservedNano).toBe(0n);
  });

  test('behavior: a structured state and instructions are accepted', async () => {
    const { key } = await server.account('1');
    const res = await decide(
      {
        model: 'jev-latest',
        state: { order_id: 'ord_1', items: 3, total_usd: 1890.5 },
        questions: { needs_review: { type: 'noul', instructions: ['fraud check', 'before shipping'] } },
      },
      key,
    );
    expect(res.status).toBe(200);
    const body = (await res.json()) as DecisionResponse;
    const answer = body.answers.needs_review;
    if (answer?.type !== 'noul') throw new Error('noul answer expected');
    expect(answer.noul).toBeGreaterThanOrEqual(0);
    expect(answer.noul).toBeLessThanOrEqual(1);
  });

  test('behavior: request rules -> 404 unknown or non-decision model, 400 bad shapes or oversized state, 402 without credentials', async () => {
    const { key } = await server.account('1');
    expect((await decide({ ...ticket, model: 'no-such-model' }, key)).status).toBe(404);
    expect((await decide({ ...ticket, model: 'llama-3.3-70b' }, key)).status).toBe(404);
    const oneOption = {
      ...ticket,
      questions: { q: { type: 'choice', instructions: 'x', criteria: { only: null } } },
    };
    expect((await decide(oneOption, key)).status).toBe(400);
    const oneLevel = {
      ...ticket,
      questions: { q: { type: 'score', instructions: 'x', criteria: ['only'] } },
    };
    expect((await decide(oneLevel, key)).status).toBe(400);
    const unknownKind = { ...ticket, questions: { q: { type: 'ranking', instructions: 'x' } } };
    expect((await decide(unknownKind, key)).status).toBe(400);
    expect((await decide({ ...ticket, questions: {} }, key)).status).toBe(400);
    expect((await decide({ ...ticket, extra: true }, key)).status).toBe(400);
    const huge = await decide({ ...ticket, state: 'word '.repeat(40_000) }, key);
    expect(huge.status).toBe(400);
    expect(((await huge.json()) as { error: string }).error).toMatch(/at most 32000/);
    expect((await decide(ticket)).status).toBe(402);
  });

  test('behavior: an OpenAI-compatible upstream answers through its function call', async () => {
    const { accountId, key } = await server.account('1');
    const res = await decide({ ...ticket, model: 'relay-decider' }, key);
    expect(res.status).toBe(200);
    expect(res.headers.get('x-service-model-router')).toBe('relay');
    const body = (await res.json()) as DecisionResponse;
    expect(validator.validate(responseSchema, body)).toEqual([]);
    expect(body.model).toBe('relay-decider');
    const charges = (await server.services.ledger.listEntries(accountId)).filter((e) => e.type === 'CHARGE');
    expect(charges[0]?.amountNano).toBe(-BigInt(body.usage.input_tokens) * 42n);
  });

  test('behavior: an upstream answer of the wrong shape -> 500 and nothing charged', async () => {
    const { accountId, key } = await server.account('1');
    const res = await decide(
      { model: 'broken-decider', state: 'x', questions: { q: { type: 'noul', instructions: 'y' } } },
      key,
    );
    expect(res.status).toBe(500);
    expect(((await res.json()) as { error: string }).error).toBe('Inference processing failed');
    const balance = await server.services.ledger.getBalance(accountId);
    expect(balance.usdNano).toBe(parseUsdToNano('1'));
    expect(balance.usdReservedNano).toBe(0n);
  });
});
