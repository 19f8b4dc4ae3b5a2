import { describe, expect, test } from 'vitest';
import {
  ContractViolationError,
  createServiceClient,
  IncompleteStreamError,
  readChatCompletionChunks,
  readSseEvents,
  ServiceApiError,
  ServiceStreamError,
} from '../../client/index.ts';

const encoder = new TextEncoder();

/** A byte stream delivered in the given pieces, to exercise frames split anywhere. */
function streamOf(...pieces: string[]): ReadableStream<Uint8Array> {
  return new ReadableStream({
    start(controller) {
      for (const piece of pieces) controller.enqueue(encoder.encode(piece));
      controller.close();
    },
  });
}

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

const chunk = (content: string) => ({
  id: 'chatcmpl-1',
  object: 'chat.completion.chunk',
  created: 1795240800,
  model: 'llama-3.3-70b',
  choices: [{ index: 0, delta: { content }, finish_reason: null }],
});

/** Records requests and answers each with the next response. */
function fakeFetch(...responses: Response[]) {
  const requests: Request[] = [];
  const fetch = async (input: Request | string | URL, init?: RequestInit) => {
    requests.push(input instanceof Request ? input : new Request(input, init));
    const next = responses.shift();
    if (!next) throw new Error('unexpected request');
    return next;
  };
  return { fetch, requests };
}

describe('readSseEvents', () => {
  test('behavior: frames split across reads, CRLF and CR line ends, comments and multi-line data', async () => {
    const events = await collect(
      readSseEvents(
        streamOf(': keep-alive\n\nda', 'ta: one\r', '\n\r\nevent: note\rdata: a\ndata: b\n', '\n'),
      ),
    );
    expect(events).toEqual([
      { event: 'message', data: 'one' },
      { event: 'note', data: 'a\nb' },
    ]);
  });

  test('behavior: a multi-byte character split between reads is decoded whole', async () => {
    const bytes = encoder.encode('data: café ☕\n\n');
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(bytes.slice(0, 10));
        controller.enqueue(bytes.slice(10));
        controller.close();
      },
    });
    expect(await collect(readSseEvents(stream))).toEqual([{ event: 'message', data: 'café ☕' }]);
  });

  test('behavior: an event without its terminating blank line is not dispatched', async () => {
    expect(await collect(readSseEvents(streamOf('data: complete\n\ndata: cut off')))).toEqual([
      { event: 'message', data: 'complete' },
    ]);
  });
});

describe('readChatCompletionChunks', () => {
  test('behavior: yields chunks until [DONE] and ignores anything after it', async () => {
    const stream = streamOf(
      `data: ${JSON.stringify(chunk('Hel'))}\n\n`,
      `data: ${JSON.stringify(chunk('lo'))}\n\ndata: [DONE]\n\n`,
      'data: {"ignored": true}\n\n',
    );
    const chunks = await collect(readChatCompletionChunks(stream));
    expect(chunks.map((c) => c.choices[0]?.delta.content)).toEqual(['Hel', 'lo']);
  });

  test('behavior: an in-band error event throws ServiceStreamError with its code', async () => {
    const stream = streamOf(
      `data: ${JSON.stringify(chunk('Hi'))}\n\n`,
      'data: {"error":{"message":"Model overloaded","type":"server_error","code":"model_overloaded","retry_after":30}}\n\n',
      'data: [DONE]\n\n',
    );
    const seen: string[] = [];
    const error = await (async () => {
      for await (const c of readChatCompletionChunks(stream)) seen.push(c.choices[0]?.delta.content ?? '');
    })().catch((e: unknown) => e);
    expect(seen).toEqual(['Hi']);
    expect(error).toBeInstanceOf(ServiceStreamError);
    expect(error).toMatchObject({ message: 'Model overloaded', code: 'model_overloaded', retryAfter: 30 });
  });

  test('behavior: a stream that stops before [DONE] throws IncompleteStreamError', async () => {
    const stream = streamOf(`data: ${JSON.stringify(chunk('Hi'))}\n\n`);
    await expect(collect(readChatCompletionChunks(stream))).rejects.toBeInstanceOf(IncompleteStreamError);
  });
});

describe('createServiceClient', () => {
  test('behavior: JSON operations send the API key and parse the typed body', async () => {
    const { fetch, requests } = fakeFetch(Response.json({ object: 'list', data: ['Anime'] }));
    const client = createServiceClient({ baseUrl: 'http://127.0.0.1:9/api/v1/', apiKey: 'k-1', fetch });
    const { data, error } = await client.GET('/image/styles');
    expect(error).toBeUndefined();
    expect(data?.data).toEqual(['Anime']);
    expect(requests[0]?.url).toBe('http://127.0.0.1:9/api/v1/image/styles');
    expect(requests[0]?.headers.get('authorization')).toBe('Bearer k-1');
  });

  test('behavior: a wallet proof source is called per request and sent as SIGN-IN-WITH-X', async () => {
    let calls = 0;
    const { fetch, requests } = fakeFetch(Response.json({ networks: [] }), Response.json({ networks: [] }));
    const client = createServiceClient({
      baseUrl: 'http://127.0.0.1:9/api/v1',
      signInWithX: async () => `proof-${++calls}`,
      fetch,
    });
    await client.GET('/crypto/rpc/networks');
    await client.GET('/crypto/rpc/networks');
    expect(requests.map((r) => r.headers.get('sign-in-with-x'))).toEqual(['proof-1', 'proof-2']);
    expect(requests[0]?.headers.has('authorization')).toBe(false);
  });

  test('behavior: streamChatCompletion posts stream: true and yields the chunks', async () => {
    const sse = new Response(streamOf(`data: ${JSON.stringify(chunk('ok'))}\n\n`, 'data: [DONE]\n\n'), {
      headers: { 'content-type': 'text/event-stream' },
    });
    const { fetch, requests } = fakeFetch(sse);
    const client = createServiceClient({ baseUrl: 'http://127.0.0.1:9/api/v1', apiKey: 'k', fetch });
    const chunks = await collect(
      client.streamChatCompletion({ model: 'llama-3.3-70b', messages: [{ role: 'user', content: 'hi' }] }),
    );
    expect(chunks).toHaveLength(1);
    expect(await requests[0]?.json()).toMatchObject({ stream: true, model: 'llama-3.3-70b' });
    expect(requests[0]?.headers.get('accept')).toBe('text/event-stream');
  });

  test('behavior: an error status before the stream throws ServiceApiError with the parsed body', async () => {
    const { fetch } = fakeFetch(Response.json({ error: 'Rate limit exceeded' }, { status: 429 }));
    const client = createServiceClient({ baseUrl: 'http://127.0.0.1:9/api/v1', apiKey: 'k', fetch });
    const error = await collect(
      client.streamChatCompletion({ model: 'm', messages: [{ role: 'user', content: 'hi' }] }),
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ServiceApiError);
    expect(error).toMatchObject({ status: 429, body: { error: 'Rate limit exceeded' } });
  });

  test('behavior: generateImageBinary asks for binary and returns the bytes with their type', async () => {
    const png = new Uint8Array([0x89, 0x50, 0x4e, 0x47]);
    const { fetch, requests } = fakeFetch(new Response(png, { headers: { 'content-type': 'image/png' } }));
    const client = createServiceClient({ baseUrl: 'http://127.0.0.1:9/api/v1', apiKey: 'k', fetch });
    const result = await client.generateImageBinary({
      model: 'z-image-turbo',
      prompt: 'a lighthouse',
      format: 'png',
    });
    expect(result.contentType).toBe('image/png');
    expect(new Uint8Array(await result.blob.arrayBuffer())).toEqual(png);
    expect(await requests[0]?.json()).toMatchObject({ return_binary: true, format: 'png' });
  });

  test('behavior: retrieveVideo returns the JSON status while processing and the bytes when done', async () => {
    const { fetch } = fakeFetch(
      Response.json({ status: 'PROCESSING', average_execution_time: 1, execution_duration: 1 }),
      new Response(new Uint8Array([0, 0, 0, 24]), { headers: { 'content-type': 'video/mp4' } }),
    );
    const client = createServiceClient({ baseUrl: 'http://127.0.0.1:9/api/v1', apiKey: 'k', fetch });
    const request = { model: 'wan-2-7-text-to-video', queue_id: 'q1' };
    expect(await client.retrieveVideo(request)).toMatchObject({ status: 'PROCESSING' });
    expect(await client.retrieveVideo(request)).toMatchObject({ contentType: 'video/mp4' });
  });
});

describe('createServiceClient with response validation', () => {
  test('behavior: each response reaches the validation with its path template and parsed body; a throw rejects the call', async () => {
    const seen: unknown[] = [];
    const { fetch } = fakeFetch(
      Response.json({ data: { slug: 'alan' } }),
      Response.json({ data: 'not an object' }),
    );
    const client = createServiceClient({
      baseUrl: 'http://127.0.0.1:9/api/v1',
      apiKey: 'k-1',
      fetch,
      validation: {
        response(response) {
          seen.push({
            method: response.method,
            path: response.path,
            kind: response.kind,
            body: response.body,
          });
          const body = response.body as { data?: unknown };
          if (typeof body.data !== 'object')
            throw new ContractViolationError('getCharacter', ['/data is not an object']);
        },
      },
    });
    const { data } = await client.GET('/characters/{slug}', { params: { path: { slug: 'alan' } } });
    expect(data).toEqual({ data: { slug: 'alan' } });
    expect(seen).toEqual([
      { method: 'GET', path: '/characters/{slug}', kind: 'json', body: { data: { slug: 'alan' } } },
    ]);
    await expect(
      client.GET('/characters/{slug}', { params: { path: { slug: 'alan' } } }),
    ).rejects.toBeInstanceOf(ContractViolationError);
  });

  test('behavior: stream and binary helpers are validated too, and each streamed chunk is checked', async () => {
    const kinds: string[] = [];
    const chunks: unknown[] = [];
    const sse = new Response(
      streamOf(
        `data: ${JSON.stringify(chunk('a'))}\n\n`,
        `data: ${JSON.stringify(chunk('b'))}\n\n`,
        'data: [DONE]\n\n',
      ),
      { headers: { 'content-type': 'text/event-stream' } },
    );
    const png = new Response(new Uint8Array([137, 80, 78, 71]), { headers: { 'content-type': 'image/png' } });
    const { fetch } = fakeFetch(sse, png);
    const client = createServiceClient({
      baseUrl: 'http://127.0.0.1:9/api/v1',
      apiKey: 'k-1',
      fetch,
      validation: {
        response: (response) => {
          kinds.push(`${response.path} ${response.kind}`);
        },
        chunk(c) {
          chunks.push(c);
          if ((c as ReturnType<typeof chunk>).choices[0]?.delta.content === 'b')
            throw new ContractViolationError('a streamed chat chunk', ['bad']);
        },
      },
    });
    const received: unknown[] = [];
    const error = await (async () => {
      for await (const c of client.streamChatCompletion({ model: 'm', messages: [] })) received.push(c);
    })().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(ContractViolationError);
    expect(received).toEqual([chunk('a')]);
    expect(chunks).toHaveLength(2);
    await client.generateImageBinary({ model: 'm', prompt: 'p' });
    expect(kinds).toEqual(['/chat/completions stream', '/image/generate binary']);
  });
});
