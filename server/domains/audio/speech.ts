/**
 * `POST /audio/speech`: resolve the model (404) and check the voice and format against its catalogue entry
 * (400), pick the backends that can produce the format (400 when none can), reserve the input's price (per
 * million characters), then synthesise, failing over while nothing was produced. The audio is answered whole,
 * or with `streaming` sent with chunked encoding as it is encoded (the same bytes either way). The price is
 * captured once the audio is complete; a failure releases it.
 */
import type { ServerResponse } from 'node:http';
import type { SpeechRequest } from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { HandlerGroups } from '../../handlers.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError, badRequest, notFound } from '../../http/errors.ts';
import type { AbortLike } from '../../http/request-abort.ts';
import {
  SPEECH_CONTENT_TYPES,
  type SpeechFormat,
  type SpeechProvider,
} from '../../providers/audio/speech-types.ts';
import { ChatProviderError } from '../../providers/chat/types.ts';
import type { CaptureItem } from '../../storage/ledger.ts';
import type { Charges } from '../billing/charges.ts';
import { createSlots } from '../concurrency.ts';
import { backendsOf, ceilDiv, MEDIA_MESSAGES, mediaApiError } from './common.ts';

export type SpeechDeps = {
  catalog: CatalogService;
  charges: Charges;
  isPro(accountId: string): Promise<boolean>;
  providerFor(backend: Backend): SpeechProvider;
};

const MILLION = 1_000_000n;
/** Sample rate of a model whose catalogue entry gives none. */
const DEFAULT_SAMPLE_RATE = 24_000;

/** The characters of the input as billed: Unicode code points. */
export const characterCount = (text: string) => Array.from(text).length;

export function speechCharge(model: CatalogModel, characters: number): CaptureItem {
  const price = model.pricing?.input?.usd ?? 0n;
  return {
    sku: 'speech.characters',
    units: (characters / 1e6).toString(),
    unitPriceNano: price,
    amountNano: ceilDiv(BigInt(characters) * price, MILLION),
  };
}

export function createSpeechHandlers(deps: SpeechDeps): HandlerGroups {
  const slots = createSlots();

  async function prepare(
    body: SpeechRequest,
    sent: Record<string, unknown> | undefined,
    principal: Principal,
  ) {
    const resolved = deps.catalog.resolveModel(body.model, 'tts');
    if (!resolved) throw notFound(`Model ${body.model.split(':')[0]} was not found`, 'MODEL_NOT_FOUND');
    const model = resolved.model;
    if (model.pro && !(await deps.isPro(principal.accountId)))
      throw new ApiError(401, MEDIA_MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });
    const voices = model.spec.voices ?? [];
    // The spec's default voice belongs to one model; a model without it speaks with its first voice.
    const voice =
      sent?.voice !== undefined || voices.includes(body.voice as string) ? (body.voice as string) : voices[0];
    if (!voice || (voices.length > 0 && !voices.includes(voice)))
      throw badRequest(
        `Voice ${voice} is not available for model ${model.id}; choose one of: ${voices.join(', ')}`,
        'INVALID_VOICE',
        { _errors: [], voice: { _errors: [`must be one of ${voices.join(', ')}`] } },
      );
    const format = (sent?.response_format ?? model.spec.defaultFormat ?? 'mp3') as SpeechFormat;
    const offered = (model.spec.supportedFormats ?? []) as string[];
    if (offered.length > 0 && !offered.includes(format))
      throw badRequest(
        `Format ${format} is not offered by model ${model.id}; choose one of: ${offered.join(', ')}`,
        'INVALID_AUDIO_FORMAT',
        { _errors: [], response_format: { _errors: [`must be one of ${offered.join(', ')}`] } },
      );
    const backends = backendsOf(model, 'speech').filter((backend) => {
      const formats = deps.providerFor(backend).formats;
      return !formats || formats.has(format);
    });
    if (backends.length === 0)
      throw badRequest(
        `Model ${model.id} cannot produce ${format} audio on its configured backends`,
        'INVALID_AUDIO_FORMAT',
      );
    return { model, voice, format, backends };
  }

  return {
    createSpeech: async (ctx) => {
      const principal = ctx.principal;
      if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
      const body = ctx.body as SpeechRequest;
      const { model, voice, format, backends } = await prepare(body, ctx.sentBody, principal);
      const charge = speechCharge(model, characterCount(body.input));
      const done = slots.acquire(model);
      let reservation: Awaited<ReturnType<Charges['reserve']>>;
      try {
        reservation = await deps.charges.reserve(principal, {
          amountNano: charge.amountNano,
          requestId: ctx.requestId,
          modelId: model.id,
        });
      } catch (error) {
        done();
        throw error;
      }
      const aborter = new AbortController();
      const onAbort = () => aborter.abort();
      ctx.signal.addEventListener('abort', onAbort, { once: true });
      const finish = () => {
        ctx.signal.removeEventListener('abort', onAbort);
        done();
      };

      // The first piece of audio, from the first backend that produces one.
      let router = 'local';
      let iterator: AsyncIterator<Buffer> | undefined;
      let first: Buffer | undefined;
      let lastError: unknown;
      for (const backend of backends) {
        const provider = deps.providerFor(backend);
        const it = provider
          .synthesize({
            model: backend.kind === 'local' ? model.id : backend.upstreamModel,
            input: body.input,
            voice,
            format,
            speed: body.speed ?? 1,
            sampleRate: model.sampleRateHz ?? DEFAULT_SAMPLE_RATE,
            ...(body.language ? { language: body.language } : {}),
            ...(body.prompt ? { prompt: body.prompt } : {}),
            ...(body.temperature !== undefined ? { temperature: body.temperature } : {}),
            ...(body.top_p !== undefined ? { topP: body.top_p } : {}),
            signal: aborter.signal,
          })
          [Symbol.asyncIterator]();
        try {
          const next = await it.next();
          iterator = it;
          first = next.done ? Buffer.alloc(0) : next.value;
          router = provider.name;
          lastError = undefined;
          break;
        } catch (error) {
          lastError = error;
          const retryable =
            error instanceof ChatProviderError && (error.kind === 'capacity' || error.kind === 'failed');
          if (!retryable || aborter.signal.aborted) break;
        }
      }
      if (!iterator || first === undefined) {
        await deps.charges.release(reservation).finally(finish);
        throw mediaApiError(lastError);
      }
      const it = iterator;
      const headers = {
        'x-service-model-id': model.id,
        'x-service-model-name': model.spec.name,
        'x-service-model-router': router,
      };
      const contentType = SPEECH_CONTENT_TYPES[format];

      if (!body.streaming) {
        const parts = [first];
        try {
          for (let next = await it.next(); !next.done; next = await it.next()) parts.push(next.value);
        } catch (error) {
          await deps.charges.release(reservation).finally(finish);
          throw mediaApiError(error);
        }
        await deps.charges.capture(reservation, [charge]).finally(finish);
        return { status: 200 as const, contentType, body: Buffer.concat(parts), headers };
      }

      return {
        headers,
        stream: async (res: ServerResponse, signal: AbortLike) => {
          signal.addEventListener('abort', onAbort, { once: true });
          res.writeHead(200, { 'Content-Type': contentType, 'Cache-Control': 'no-cache' });
          let failed = false;
          try {
            if (first && first.length > 0) res.write(first);
            for (let next = await it.next(); !next.done; next = await it.next()) {
              if (res.destroyed) break;
              if (!res.write(next.value)) await new Promise((resolve) => res.once('drain', resolve));
            }
          } catch {
            failed = true;
          } finally {
            signal.removeEventListener('abort', onAbort);
          }
          try {
            // A broken stream delivered no usable file: nothing is charged. A client that left mid-way
            // had the work done for it: the characters are charged.
            if (failed && !aborter.signal.aborted) await deps.charges.release(reservation);
            else await deps.charges.capture(reservation, [charge]);
          } finally {
            finish();
            if (failed && !aborter.signal.aborted) res.destroy();
            else res.end();
          }
        },
      };
    },
  };
}
