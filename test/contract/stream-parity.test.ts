/**
 * The mock streams the same frame shapes the real server does: one streamed chat request to each, every frame
 * validated against the `ChatCompletionChunk` schema, both streams following the same grammar (role, content,
 * finish, usage with cost, `[DONE]`), and the frames of each kind carrying the same fields.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { readSseEvents } from '../../client/sse.ts';
import { type RunningMock, startMock } from '../../mocks/front.ts';
import { ContractValidator, loadBundle } from '../support/contract.ts';
import { type StartedServer, startServer, TEST_ADMIN_KEY } from '../support/server.ts';

const validator = new ContractValidator(loadBundle());
const chunkSchema = validator.schema('ChatCompletionChunk');
const scratch = mkdtempSync(join(tmpdir(), 'stream-parity-'));
let mock: RunningMock;
let server: StartedServer;

beforeAll(async () => {
  [mock, server] = await Promise.all([
    startMock({ port: 0, log: () => {} }),
    startServer(`sqlite:${join(scratch, 'parity.db')}`, {}, { proxy: false }),
  ]);
});

afterAll(async () => {
  await Promise.all([mock?.close(), server?.close()]);
  rmSync(scratch, { recursive: true, force: true });
});

type Chunk = {
  choices: { delta: Record<string, unknown>; finish_reason: string | null }[];
  usage?: unknown;
  cost?: unknown;
} & Record<string, unknown>;

/** What a frame is: the role opener, a content delta, the finish, or the closing usage frame. */
function kindOf(chunk: Chunk): string {
  const choice = chunk.choices[0];
  if (!choice) return chunk.usage && chunk.cost ? 'usage' : 'empty';
  if (choice.finish_reason) return 'finish';
  if (choice.delta.role) return 'role';
  return 'content';
}

async function stream(base: string, apiKey: string): Promise<{ frames: Chunk[]; done: boolean }> {
  const response = await fetch(`${base}/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'llama-3.3-70b',
      seed: 3,
      max_completion_tokens: 30,
      stream: true,
      messages: [{ role: 'user', content: 'What is the capital of France?' }],
    }),
  });
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
  const data: string[] = [];
  for await (const event of readSseEvents(response.body as ReadableStream<Uint8Array>)) data.push(event.data);
  return {
    frames: data.filter((d) => d !== '[DONE]').map((d) => JSON.parse(d) as Chunk),
    done: data.at(-1) === '[DONE]',
  };
}

/** The sequence of kinds with repeats of content collapsed: the stream's grammar. */
const grammar = (frames: Chunk[]) =>
  frames.map(kindOf).filter((kind, i, all) => !(kind === 'content' && all[i - 1] === 'content'));

/** Field names per frame kind (top level and delta), as a comparable shape. */
function shapes(frames: Chunk[]): Record<string, { top: string[]; delta: string[] }> {
  const out: Record<string, { top: Set<string>; delta: Set<string> }> = {};
  for (const frame of frames) {
    const kind = kindOf(frame);
    out[kind] ??= { top: new Set(), delta: new Set() };
    for (const key of Object.keys(frame)) out[kind].top.add(key);
    for (const key of Object.keys(frame.choices[0]?.delta ?? {})) out[kind].delta.add(key);
  }
  return Object.fromEntries(
    Object.entries(out).map(([kind, s]) => [kind, { top: [...s.top].sort(), delta: [...s.delta].sort() }]),
  );
}

describe('streamed chat: mock and server in step', () => {
  test('behavior: both streams validate frame by frame, follow one grammar and carry the same fields per frame kind', async () => {
    const [mocked, real] = await Promise.all([
      stream(mock.url, 'mock-key'),
      stream(server.directBase, TEST_ADMIN_KEY),
    ]);
    for (const [name, result] of [
      ['mock', mocked],
      ['server', real],
    ] as const) {
      expect(result.done, `${name} ends with [DONE]`).toBe(true);
      result.frames.forEach((frame, i) => {
        expect(validator.validate(chunkSchema, frame), `${name} frame ${i}`).toEqual([]);
      });
      expect(grammar(result.frames), name).toEqual(['role', 'content', 'finish', 'usage']);
    }
    expect(shapes(real.frames)).toEqual(shapes(mocked.frames));
  });
});
