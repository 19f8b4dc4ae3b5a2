/**
 * The OpenAI-compatible embeddings adapter: `POST <baseUrl>/embeddings` with the texts, asking for floats.
 * The answer is distrusted: one vector per input (by `index`), each of the expected length and made of
 * finite numbers (a base64 answer is decoded as little-endian float32), else the call failed.
 */

import { postUpstream } from '../audio/upstream-http.ts';
import { ChatProviderError } from '../chat/types.ts';
import type { UpstreamAdapterOptions } from '../http.ts';
import type { EmbeddingProvider, EmbeddingProviderRequest, EmbeddingProviderResult } from './types.ts';

export type OpenAiCompatibleEmbeddingsOptions = UpstreamAdapterOptions;

type UpstreamEmbeddings = {
  data?: { index?: unknown; embedding?: unknown }[];
  usage?: { prompt_tokens?: unknown };
};

/** Little-endian float32 bytes (the OpenAI base64 encoding) to numbers. */
export function decodeFloat32Base64(text: string): Float32Array {
  const bytes = Buffer.from(text, 'base64');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Float32Array(Math.floor(bytes.byteLength / 4));
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

export function createOpenAiCompatibleEmbeddings(
  options: OpenAiCompatibleEmbeddingsOptions,
): EmbeddingProvider {
  const url = `${options.baseUrl.replace(/\/+$/, '')}/embeddings`;
  return {
    name: options.name,
    async embed(request: EmbeddingProviderRequest): Promise<EmbeddingProviderResult> {
      const answer = await postUpstream({
        name: options.name,
        url,
        timeoutMs: options.timeoutMs,
        maxBytes: options.maxBytes ?? 64 * 1024 * 1024,
        body: JSON.stringify({
          model: options.upstreamModel,
          input: request.inputs,
          encoding_format: 'float',
          ...(request.customDimensions ? { dimensions: request.dimensions } : {}),
        }),
        ...(options.apiKey ? { apiKey: options.apiKey } : {}),
        ...(request.signal ? { signal: request.signal } : {}),
        ...(options.fetch ? { fetch: options.fetch } : {}),
        ...(options.observe ? { observe: options.observe } : {}),
      });
      const malformed = (why: string) =>
        new ChatProviderError('failed', `Upstream ${options.name} sent malformed embeddings: ${why}`);
      let parsed: UpstreamEmbeddings;
      try {
        parsed = JSON.parse(answer.body.toString('utf8')) as UpstreamEmbeddings;
      } catch (error) {
        throw new ChatProviderError('failed', `Upstream ${options.name} did not answer with JSON`, {
          cause: error,
        });
      }
      if (!Array.isArray(parsed.data)) throw malformed('no data list');
      if (parsed.data.length !== request.inputs.length)
        throw malformed(`${parsed.data.length} vectors for ${request.inputs.length} inputs`);
      const vectors: (Float32Array | undefined)[] = new Array(request.inputs.length);
      parsed.data.forEach((item, position) => {
        const index = item.index === undefined ? position : item.index;
        if (
          typeof index !== 'number' ||
          !Number.isInteger(index) ||
          index < 0 ||
          index >= vectors.length ||
          vectors[index]
        )
          throw malformed('bad or repeated index');
        let vector: Float32Array;
        if (typeof item.embedding === 'string') vector = decodeFloat32Base64(item.embedding);
        else if (Array.isArray(item.embedding) && item.embedding.every((x) => typeof x === 'number'))
          vector = Float32Array.from(item.embedding as number[]);
        else throw malformed('an embedding is neither numbers nor base64');
        if (vector.length !== request.dimensions)
          throw malformed(`a vector has ${vector.length} dimensions, expected ${request.dimensions}`);
        if (!vector.every(Number.isFinite)) throw malformed('a vector holds a non-finite number');
        vectors[index] = vector;
      });
      const tokens = parsed.usage?.prompt_tokens;
      return {
        vectors: vectors as Float32Array[],
        ...(typeof tokens === 'number' && Number.isInteger(tokens) && tokens >= 0
          ? { promptTokens: tokens }
          : {}),
      };
    },
  };
}
