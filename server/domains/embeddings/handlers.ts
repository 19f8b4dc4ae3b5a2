/**
 * `POST /embeddings`: the OpenAI-shaped list of vectors, as JSON numbers or (with `encoding_format: base64`)
 * as the base64 of little-endian float32 values, with token usage.
 */
import type { EmbeddingRequest, EmbeddingResponse } from '../../../generated/api.d.ts';
import type { HandlerGroups } from '../../handlers.ts';
import { ApiError } from '../../http/errors.ts';
import type { EmbeddingService } from './service.ts';

/** Little-endian float32 bytes, base64 (what OpenAI clients decode). */
export function encodeFloat32Base64(vector: Float32Array): string {
  const bytes = Buffer.alloc(vector.length * 4);
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i] ?? 0, i * 4);
  return bytes.toString('base64');
}

export function createEmbeddingHandlers(deps: { embeddings: EmbeddingService }): HandlerGroups {
  return {
    createEmbedding: async (ctx) => {
      const principal = ctx.principal;
      if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
      const body = ctx.body as EmbeddingRequest;
      const result = await deps.embeddings.embed({
        body,
        principal,
        requestId: ctx.requestId,
        signal: ctx.signal,
      });
      const base64 = body.encoding_format === 'base64';
      const response: EmbeddingResponse = {
        object: 'list',
        data: result.vectors.map((vector, index) => ({
          object: 'embedding' as const,
          index,
          embedding: base64 ? encodeFloat32Base64(vector) : Array.from(vector),
        })),
        model: result.model.id,
        usage: { prompt_tokens: result.promptTokens, total_tokens: result.promptTokens },
      };
      return {
        status: 200 as const,
        body: response,
        headers: {
          'x-service-model-id': result.model.id,
          'x-service-model-name': result.model.spec.name,
          'x-service-model-router': result.router,
        },
      };
    },
  };
}
