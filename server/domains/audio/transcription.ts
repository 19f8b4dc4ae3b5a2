/**
 * `POST /audio/transcriptions`: the recording (multipart, at most 25 MB: 413 above, enforced by the upload
 * limits) goes to the model's OpenAI-compatible backend; no recogniser is embedded, so a model without one
 * answers 503. Billing per audio second: the reservation is the most the file can last (exact for WAV, from
 * its header; otherwise at 8 kbit/s, below any usable compressed speech), the capture the duration the backend
 * reports (else the WAV header, else the end of the last timed segment), never above the reservation.
 */
import type { TranscriptionRequest, TranscriptionResponse } from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { HandlerGroups } from '../../handlers.ts';
import { ApiError, badRequest } from '../../http/errors.ts';
import type {
  TranscriptionProvider,
  TranscriptionResult,
} from '../../providers/audio/transcription-types.ts';
import { ChatProviderError } from '../../providers/chat/types.ts';
import type { CaptureItem } from '../../storage/ledger.ts';
import type { Charges } from '../billing/charges.ts';
import { createSlots } from '../concurrency.ts';
import { backendsOf, ceilDiv, MEDIA_MESSAGES, mediaApiError, withFailover } from './common.ts';

export type TranscriptionDeps = {
  catalog: CatalogService;
  charges: Charges;
  isPro(accountId: string): Promise<boolean>;
  providerFor(backend: Backend): TranscriptionProvider;
};

/** The lowest bit rate assumed for a recording whose duration cannot be read before transcription. */
const MIN_BITS_PER_SECOND = 8000;

/** Seconds of a PCM WAV file, from its `fmt ` and `data` chunks; undefined when it is not one. */
export function wavDuration(bytes: Buffer): number | undefined {
  if (
    bytes.length < 12 ||
    bytes.toString('latin1', 0, 4) !== 'RIFF' ||
    bytes.toString('latin1', 8, 12) !== 'WAVE'
  )
    return undefined;
  let byteRate: number | undefined;
  let offset = 12;
  while (offset + 8 <= bytes.length) {
    const id = bytes.toString('latin1', offset, offset + 4);
    const size = bytes.readUInt32LE(offset + 4);
    if (id === 'fmt ' && offset + 16 <= bytes.length) byteRate = bytes.readUInt32LE(offset + 8 + 8);
    if (id === 'data') {
      if (!byteRate) return undefined;
      return Math.min(size, bytes.length - offset - 8) / byteRate;
    }
    offset += 8 + size + (size % 2);
  }
  return undefined;
}

export function transcriptionCharge(model: CatalogModel, seconds: number): CaptureItem {
  const price = model.pricing?.per_audio_second?.usd ?? 0n;
  const millis = BigInt(Math.ceil(seconds * 1000));
  return {
    sku: 'transcription.audio_seconds',
    units: (Number(millis) / 1000).toString(),
    unitPriceNano: price,
    amountNano: ceilDiv(millis * price, 1000n),
  };
}

export function createTranscriptionHandlers(deps: TranscriptionDeps): HandlerGroups {
  const slots = createSlots();
  return {
    createTranscription: async (ctx) => {
      const principal = ctx.principal;
      if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
      const body = ctx.body as unknown as Omit<TranscriptionRequest, 'timestamps'> & { timestamps?: unknown };
      const file = ctx.files?.find((f) => f.fieldname === 'file');
      if (!file || file.size === 0)
        throw badRequest(
          'file is required: send the recording as the multipart field `file`',
          'INVALID_REQUEST',
          {
            _errors: [],
            file: { _errors: ['is required'] },
          },
        );
      const resolved = deps.catalog.resolveModel(body.model, 'asr');
      // This operation declares no 404: an unknown model is an invalid field.
      if (!resolved) throw badRequest(`Model ${body.model.split(':')[0]} was not found`, 'INVALID_MODEL');
      const model = resolved.model;
      if (model.pro && !(await deps.isPro(principal.accountId)))
        throw new ApiError(401, MEDIA_MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });
      // No recogniser is embedded: only upstream backends can serve.
      const backends = backendsOf(model, 'transcription').filter((b) => b.kind !== 'local');
      if (backends.length === 0)
        throw new ApiError(503, `No transcription backend is configured for model ${model.id}`, {
          code: 'MODEL_OFFLINE',
        });
      const timestamps = body.timestamps === true || body.timestamps === 'true';
      const format = body.response_format ?? 'json';

      const known = wavDuration(file.buffer);
      const bound = known ?? (file.size * 8) / MIN_BITS_PER_SECOND;
      const reserved = transcriptionCharge(model, bound);
      const done = slots.acquire(model);
      try {
        const reservation = await deps.charges.reserve(principal, {
          amountNano: reserved.amountNano,
          requestId: ctx.requestId,
          modelId: model.id,
        });
        let router = '';
        let result: TranscriptionResult;
        try {
          result = await withFailover(backends, ctx.signal, async (backend) => {
            const provider = deps.providerFor(backend);
            const answer = await provider.transcribe({
              model: backend.kind === 'local' ? model.id : backend.upstreamModel,
              file: { buffer: file.buffer, filename: file.originalname || 'audio', mimetype: file.mimetype },
              ...(body.language ? { language: body.language } : {}),
              timestamps,
              signal: ctx.signal,
            });
            router = provider.name;
            return answer;
          });
        } catch (error) {
          await deps.charges.release(reservation);
          // A refusal by the recogniser is about the audio (our own checks passed): 422.
          if (error instanceof ChatProviderError && error.kind === 'bad_request')
            throw new ApiError(422, error.message, { code: 'ASR_UPSTREAM_VALIDATION_FAILED', cause: error });
          throw mediaApiError(error);
        }
        const lastEnd = Math.max(
          0,
          ...(result.segments ?? []).map((s) => s.end),
          ...(result.words ?? []).map((w) => w.end),
        );
        const duration = Math.min(result.duration ?? known ?? lastEnd, bound);
        await deps.charges.capture(reservation, [transcriptionCharge(model, duration)]);
        const headers = {
          'x-service-model-id': model.id,
          'x-service-model-name': model.spec.name,
          'x-service-model-router': router,
        };
        if (format === 'text')
          return {
            status: 200 as const,
            contentType: 'text/plain; charset=utf-8',
            body: result.text,
            headers,
          };
        const response: TranscriptionResponse = {
          text: result.text,
          duration: Math.round(duration * 1000) / 1000,
          ...(timestamps
            ? {
                timestamps: {
                  ...(result.words ? { word: result.words } : {}),
                  ...(result.segments ? { segment: result.segments } : {}),
                },
              }
            : {}),
        };
        return { status: 200 as const, body: response, headers };
      } finally {
        done();
      }
    },
  };
}
