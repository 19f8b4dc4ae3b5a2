/**
 * The chat upstream adapter's transport (server/providers/upstream-post.ts) against a real local HTTP server:
 * a finished stream hands its connection back for the next call (keep-alive), while an answer cut short by
 * the adapter (over the byte cap) drops its connection rather than leaving half a body on it. Connections are
 * told apart by their port on the server's side.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, expect, test } from 'vitest';
import { createOpenAiCompatibleProvider } from '../../server/providers/chat/openai-compatible.ts';
import type { ChatEvent, ChatProviderRequest } from '../../server/providers/chat/types.ts';
import { dispatchPost } from '../../server/providers/upstream-post.ts';

let server: Server;
let base = '';
let connections = 0;
/** The client port of the connection each request came in on, in order. */
const requestPorts: number[] = [];
/** The client ports of the connections the server has seen closed. */
const closedPorts = new Set<number>();
/** Bytes of filler before `[DONE]` in the next answer. */
let filler = 0;

const chunk = (content: string) =>
  `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;

beforeAll(async () => {
  server = createServer((req, res) => {
    requestPorts.push(req.socket.remotePort ?? 0);
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk('Hello'));
      if (filler > 0) res.write(chunk('x'.repeat(filler)));
      res.write(
        `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }], usage: { prompt_tokens: 3, completion_tokens: 1 } })}\n\n`,
      );
      res.end('data: [DONE]\n\n');
    });
  });
  server.on('connection', (socket) => {
    connections += 1;
    const port = socket.remotePort ?? 0;
    socket.on('close', () => closedPorts.add(port));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

const request: ChatProviderRequest = {
  model: 'm',
  messages: [{ role: 'user', content: 'hi' }],
  maxTokens: 8,
  n: 1,
  sampling: {},
};

async function collect(maxBytes?: number): Promise<ChatEvent[]> {
  const provider = createOpenAiCompatibleProvider({
    name: 'local',
    baseUrl: base,
    upstreamModel: 'm',
    timeoutMs: 5000,
    ...(maxBytes ? { maxBytes } : {}),
  });
  const events: ChatEvent[] = [];
  for await (const event of provider.stream(request)) events.push(event);
  return events;
}

test('behavior: finished streams reuse one kept-alive connection; a stream cut at the byte cap drops its own', async () => {
  const before = connections;
  for (let i = 0; i < 3; i++) {
    // The events end at `[DONE]`; the connection is handed back once the body's last marker is read, a tick
    // later (a request that reaches the server afterwards finds it free).
    if (i > 0) await new Promise((resolve) => setImmediate(resolve));
    const events = await collect();
    expect(events.filter((e) => e.type === 'delta').map((e) => (e as { content?: string }).content)).toEqual([
      'Hello',
    ]);
    expect(events.at(-1)).toMatchObject({ type: 'usage', usage: { promptTokens: 3, completionTokens: 1 } });
  }
  expect(connections - before).toBe(1);

  filler = 64 * 1024;
  await new Promise((resolve) => setImmediate(resolve));
  await expect(collect(16 * 1024)).rejects.toMatchObject({ kind: 'failed' });
  const cut = requestPorts.at(-1) as number;
  // The kept-alive connection carried the cut answer too, and the cut dropped it.
  expect(cut).toBe(requestPorts[0]);
  await expect.poll(() => closedPorts.has(cut)).toBe(true);
  filler = 0;
  // The cut connection is not reused: the next call comes on another one, and works.
  const events = await collect();
  expect(events.at(-1)).toMatchObject({ type: 'usage' });
  expect(requestPorts.at(-1)).not.toBe(cut);
});

test('behavior: a call cancelled before it reaches a connection fails at once and sends nothing', async () => {
  const before = requestPorts.length;
  const call = dispatchPost(`${base}/chat/completions`, {
    headers: { 'content-type': 'application/json' },
    body: '{}',
  });
  call.cancel();
  await expect(call.answer).rejects.toMatchObject({ name: 'AbortError' });
  // A call made afterwards is answered; the cancelled one never arrived.
  const events = await collect();
  expect(events.at(-1)).toMatchObject({ type: 'usage' });
  expect(requestPorts.length - before).toBe(1);
});

test('behavior: an answer faster than its reader arrives whole and in order (the connection paused, then resumed)', async () => {
  const parts = Array.from({ length: 200 }, (_, i) => `${String(i).padStart(4, '0')}:${'y'.repeat(1000)}\n`);
  const fast = createServer((req, res) => {
    req.resume();
    req.on('end', async () => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      // Each part in a write of its own, a turn apart: far more chunks than the transport holds unread.
      for (const part of parts) {
        res.write(part);
        await new Promise((resolve) => setImmediate(resolve));
      }
      res.end();
    });
  });
  await new Promise<void>((resolve) => fast.listen(0, '127.0.0.1', resolve));
  try {
    const url = `http://127.0.0.1:${(fast.address() as AddressInfo).port}/slow`;
    const answer = await dispatchPost(url, { headers: {}, body: '{}' }).answer;
    let received = '';
    let reads = 0;
    for await (const bytes of answer.body) {
      received += Buffer.from(bytes).toString('utf8');
      // A slow reader: the upstream keeps writing meanwhile.
      if (++reads % 5 === 1) await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(received).toBe(parts.join(''));
    await answer.release(true);
  } finally {
    fast.closeAllConnections();
    await new Promise((resolve) => fast.close(resolve));
  }
});
