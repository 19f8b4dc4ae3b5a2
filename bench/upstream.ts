/**
 * A minimal OpenAI-compatible upstream for the benchmark: `POST /v1/chat/completions` answers at once, as a
 * stream (`stream: true`, with a usage chunk and `[DONE]`) or as one JSON completion. The harness measures it
 * directly and through the server's upstream adapter, so the difference is what the gateway adds.
 * Listens on 127.0.0.1 at the port in `PORT`.
 */
import { createServer } from 'node:http';

const created = Math.floor(Date.now() / 1000);
const base = { id: 'chatcmpl-bench', created, model: 'bench-upstream' };
const words = ['Hello', ' from', ' the', ' bench', ' upstream', '.'];
const sse =
  words
    .map(
      (content) =>
        `data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`,
    )
    .join('') +
  `data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\n\n` +
  `data: ${JSON.stringify({ ...base, object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 12, completion_tokens: words.length, total_tokens: 12 + words.length } })}\n\n` +
  'data: [DONE]\n\n';
const json = JSON.stringify({
  ...base,
  object: 'chat.completion',
  choices: [{ index: 0, message: { role: 'assistant', content: words.join('') }, finish_reason: 'stop' }],
  usage: { prompt_tokens: 12, completion_tokens: words.length, total_tokens: 12 + words.length },
});

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.on('end', () => {
    if (req.method !== 'POST' || !req.url?.endsWith('/chat/completions')) {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"not found"}');
      return;
    }
    let stream = false;
    try {
      stream = (JSON.parse(Buffer.concat(chunks).toString('utf8')) as { stream?: unknown }).stream === true;
    } catch {
      res.writeHead(400, { 'content-type': 'application/json' }).end('{"error":"bad json"}');
      return;
    }
    if (stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
      res.end(sse);
    } else {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(json) });
      res.end(json);
    }
  });
});
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1');
process.on('SIGTERM', () => server.close(() => process.exit(0)));
