/**
 * The video service: the quote / queue / retrieve / complete lifecycle over the job store.
 *
 *   quote:    model (404), options against its constraints (400), the price.
 *   queue:    the same checks plus prompt limits, inputs and consent (409), then the job row (`unpaid`), the
 *             charge of the full price (reserve, capture: 402 before any work) and the hand-over to the workers
 *             (`queued`). Any worker on any instance renders it (see worker.ts).
 *   retrieve: `PROCESSING` with timings while queued or running; the MP4 (or `COMPLETED` with the download link)
 *             when done; the failure as 422 (content policy) or 500 once the job failed, always after its price
 *             was refunded with a REFUND ledger entry.
 *   complete: deletes the job and its media (`success: false` while it is still running).
 *
 * A job is visible only to the account that queued it; anything else answers 404, as does an expired job.
 */
import { randomBytes, randomInt, randomUUID, timingSafeEqual } from 'node:crypto';
import type {
  VideoQueueRequest,
  VideoQueueResponse,
  VideoQuoteRequest,
  VideoRetrieveStatus,
} from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError, badRequest, notFound } from '../../http/errors.ts';
import { nanoToUsdNumber } from '../../money.ts';
import type { VideoGenerationRequest } from '../../providers/video/types.ts';
import { NothingToRefundError } from '../../storage/errors.ts';
import { chargeSeqsOf, type LedgerRepository } from '../../storage/ledger.ts';
import type { VideoJob, VideoJobsRepository } from '../../storage/video-jobs.ts';
import type { Charges } from '../billing/charges.ts';
import { resolveVideoOptions, videoConstraints } from './options.ts';

export const VIDEO_MESSAGES = {
  notFound: 'Media could not be found. Request may be invalid, expired, or deleted.',
  failed: 'Inference processing failed',
  noBackend: 'The model is at capacity. Please try again later.',
  proOnly: 'This model is only available to Pro users',
  consent: 'Consent is required before this model can animate the faces in the supplied media',
};

/** The policy a consent flow asks the caller to accept (409 NEEDS_CONSENT). */
export const CONSENT_POLICY = {
  version: '2026-10-01',
  policyText:
    'By continuing you confirm that you accept the terms of use and the privacy policy, that you have the legal ' +
    'right to use the likeness of every person shown, and that the media is screened before generation.',
};

/**
 * Stored with the job: everything the worker needs to run it, minus the backend's model name, plus the secret
 * of its download link on models that deliver through one.
 */
export type StoredVideoParams = Omit<VideoGenerationRequest, 'model'> & { downloadToken?: string };

export type VideoServiceDeps = {
  catalog: CatalogService;
  charges: Charges;
  ledger: LedgerRepository;
  jobs: VideoJobsRepository;
  isPro(accountId: string): Promise<boolean>;
  /** How long a job and its media are kept. */
  mediaTtlMs: number;
  /** Tells the local worker that a job is waiting (it also polls). */
  wake?(): void;
  /** Origin of the download links of models that deliver through one (`video.downloadUrl`). */
  publicOrigin?: string;
  now?: () => number;
};

export type VideoService = ReturnType<typeof createVideoService>;

/** The media inputs a request supplies, by the role names of the consent error. */
function mediaRoles(body: VideoQueueRequest): Array<'image' | 'end_image' | 'reference_image' | 'video'> {
  const roles: Array<'image' | 'end_image' | 'reference_image' | 'video'> = [];
  if (body.image_url) roles.push('image');
  if (body.end_image_url) roles.push('end_image');
  if ((body.reference_image_urls ?? []).length > 0) roles.push('reference_image');
  if (body.video_url) roles.push('video');
  return roles;
}

/**
 * Refunds a failed job's charges (once; the ledger refuses a second refund of the same request). A job without
 * charges (the queuing request died before its capture, which queues the job) has nothing to give back.
 */
export async function refundJob(
  deps: { ledger: LedgerRepository; jobs: VideoJobsRepository },
  job: VideoJob,
) {
  if (job.chargeSeqs) {
    try {
      await deps.ledger.refund({
        accountId: job.accountId,
        requestId: job.requestId,
        chargeSeqs: job.chargeSeqs,
      });
    } catch (error) {
      if (!(error instanceof NothingToRefundError)) throw error;
    }
  }
  await deps.jobs.markRefunded(job.id);
}

/** Thrown in a capture's transaction when the job it pays for was given up meanwhile: nothing is charged. */
class JobGivenUp extends Error {}

/** Path of a job's download link, outside the API base path (see download-route.ts). */
export const DOWNLOAD_PATH = '/media/video';

export function createVideoService(deps: VideoServiceDeps) {
  const now = deps.now ?? Date.now;

  /** The pre-signed link of a job: its secret token and expiry in the query. */
  function downloadUrlOf(job: { id: string; params: unknown; expiresAtMs: number }): string | undefined {
    const token = (job.params as StoredVideoParams).downloadToken;
    if (!token || !deps.publicOrigin) return undefined;
    const expires = Math.floor(job.expiresAtMs / 1000);
    return `${deps.publicOrigin}${DOWNLOAD_PATH}/${job.id}.mp4?expires=${expires}&token=${token}`;
  }

  function resolveModel(name: string): CatalogModel {
    const resolved = deps.catalog.resolveModel(name, 'video');
    if (!resolved) throw notFound(`Model ${name.split(':')[0]} was not found`, 'MODEL_NOT_FOUND');
    return resolved.model;
  }

  /** The job of `queueId` if the caller owns it on `model` and it has not expired; 404 otherwise. */
  async function ownedJob(principal: Principal, modelName: string, queueId: string): Promise<VideoJob> {
    const resolved = deps.catalog.resolveModel(modelName, 'video');
    const job = await deps.jobs.get(queueId);
    if (
      !job ||
      !resolved ||
      job.accountId !== principal.accountId ||
      job.modelId !== resolved.model.id ||
      job.status === 'unpaid' ||
      job.expiresAtMs <= now()
    ) {
      throw notFound(VIDEO_MESSAGES.notFound, 'MEDIA_NOT_FOUND');
    }
    return job;
  }

  function checkInputs(model: CatalogModel, body: VideoQueueRequest, backend: Backend) {
    const c = videoConstraints(model);
    if (body.prompt.length > c.promptLimit) {
      throw badRequest(
        `Prompt exceeds the ${c.promptLimit}-character limit of model ${model.id}`,
        'INVALID_REQUEST',
        {
          _errors: [],
          prompt: { _errors: [`String must contain at most ${c.promptLimit} character(s)`] },
        },
      );
    }
    if (body.negative_prompt && body.negative_prompt.length > c.promptLimit) {
      throw badRequest(
        `Negative prompt exceeds the ${c.promptLimit}-character limit of model ${model.id}`,
        'INVALID_REQUEST',
        {
          _errors: [],
          negative_prompt: { _errors: [`String must contain at most ${c.promptLimit} character(s)`] },
        },
      );
    }
    const imageModel = c.modelType === 'image-to-video';
    if (imageModel && !body.image_url) {
      throw badRequest(`Model ${model.id} animates an image: image_url is required`, 'INVALID_REQUEST', {
        _errors: [],
        image_url: { _errors: ['Required'] },
      });
    }
    const unsupported = [
      ...(imageModel ? [] : (['image_url', 'end_image_url'] as const)),
      'video_url',
      'audio_url',
      'reference_image_urls',
      'reference_video_urls',
      'reference_audio_urls',
    ].filter((key) => body[key as keyof VideoQueueRequest] !== undefined);
    if (unsupported.length > 0) {
      throw badRequest(`Model ${model.id} does not take ${unsupported.join(', ')}`, 'INVALID_REQUEST');
    }
    if (backend.kind === 'local') {
      for (const key of ['image_url', 'end_image_url'] as const) {
        const url = body[key];
        if (url !== undefined && !/^data:image\/(png|jpeg|jpg|webp);base64,/i.test(url)) {
          throw badRequest(`The local video engine takes ${key} as a data URL of a PNG, JPEG or WebP image`);
        }
      }
    }
  }

  function checkConsent(model: CatalogModel, body: VideoQueueRequest) {
    const flow = model.video?.consentFlow;
    if (!flow) return;
    const roles = mediaRoles(body);
    if (roles.length === 0) return;
    const given = body.consents?.[flow];
    if (
      given?.confirmed_terms_and_privacy === true &&
      given.confirmed_legal_right === true &&
      given.confirmed_screening_acknowledged === true
    ) {
      return;
    }
    throw new ApiError(409, VIDEO_MESSAGES.consent, {
      code: 'NEEDS_CONSENT',
      body: {
        error: VIDEO_MESSAGES.consent,
        code: 'NEEDS_CONSENT',
        consentFlow: flow,
        faceMediaRoles: roles,
        consent: CONSENT_POLICY,
        docsUrl: '/docs#video-consent',
      },
    });
  }

  return {
    quote(body: VideoQuoteRequest): { quote: number; model: CatalogModel } {
      const model = resolveModel(body.model);
      const options = resolveVideoOptions(model, body);
      return { quote: nanoToUsdNumber(options.priceNano), model };
    },

    async queue(input: {
      body: VideoQueueRequest;
      principal: Principal;
      requestId: string;
    }): Promise<{ response: VideoQueueResponse; model: CatalogModel; backend: Backend }> {
      const { body, principal } = input;
      const model = resolveModel(body.model);
      if (model.pro && !(await deps.isPro(principal.accountId)))
        throw new ApiError(401, VIDEO_MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });
      const backend = model.backends[0];
      if (!backend) throw new ApiError(503, VIDEO_MESSAGES.noBackend, { code: 'MODEL_AT_CAPACITY' });
      const options = resolveVideoOptions(model, body);
      checkInputs(model, body, backend);
      checkConsent(model, body);

      const params: StoredVideoParams = {
        prompt: body.prompt,
        ...(body.negative_prompt ? { negativePrompt: body.negative_prompt } : {}),
        duration: options.duration,
        durationSeconds: options.durationSeconds,
        resolution: options.resolution,
        ...(options.aspectRatio ? { aspectRatio: options.aspectRatio } : {}),
        audio: options.audio,
        seed: body.seed ?? randomInt(0, 999_999_999),
        ...(body.image_url ? { imageUrl: body.image_url } : {}),
        ...(body.end_image_url ? { endImageUrl: body.end_image_url } : {}),
        ...(model.video?.downloadUrl ? { downloadToken: randomBytes(24).toString('base64url') } : {}),
      };
      const id = randomUUID();
      const created = await deps.jobs.create({
        id,
        accountId: principal.accountId,
        apiKeyId: principal.kind === 'apiKey' ? principal.keyId : null,
        requestId: input.requestId,
        modelId: model.id,
        backend: backend.name,
        params,
        priceNano: options.priceNano,
        ttlMs: deps.mediaTtlMs,
      });
      let reservation: Awaited<ReturnType<Charges['reserve']>>;
      try {
        reservation = await deps.charges.reserve(principal, {
          amountNano: options.priceNano,
          requestId: input.requestId,
          modelId: model.id,
        });
      } catch (error) {
        await deps.jobs.deleteUnpaid(id);
        throw error;
      }
      try {
        // Charged and queued in one transaction: the job keeps its charges' seqs, for its refund.
        await deps.charges.captureWith(
          reservation,
          options.items.map((item) => ({ ...item, modelId: model.id, details: { queueId: id } })),
          async (trx, entries) => {
            if (!(await deps.jobs.markQueued(id, chargeSeqsOf(entries), trx))) throw new JobGivenUp();
          },
        );
      } catch (error) {
        if (!(error instanceof JobGivenUp)) throw error;
        // The sweep gave the job up while this request was stalled between its row and its charge: nothing
        // was charged, and the hold goes back.
        await deps.charges.release(reservation);
        throw new ApiError(500, VIDEO_MESSAGES.failed, { code: 'INFERENCE_FAILED' });
      }
      deps.wake?.();
      const downloadUrl = downloadUrlOf(created);
      return {
        response: { model: model.id, queue_id: id, ...(downloadUrl ? { download_url: downloadUrl } : {}) },
        model,
        backend,
      };
    },

    async retrieve(input: {
      principal: Principal;
      model: string;
      queueId: string;
      deleteMedia: boolean;
    }): Promise<
      | { kind: 'status'; body: VideoRetrieveStatus; job: VideoJob }
      | { kind: 'video'; bytes: Buffer; contentType: string; job: VideoJob }
    > {
      let job = await ownedJob(input.principal, input.model, input.queueId);
      const model = deps.catalog.getModel(job.modelId);
      if (job.status === 'failed') {
        if (!job.refunded) {
          await refundJob(deps, job);
          job = { ...job, refunded: true };
        }
        if (job.errorCode === 'CONTENT_POLICY_VIOLATION') {
          throw new ApiError(422, job.errorMessage ?? 'The video provider rejected this job', {
            code: job.errorCode,
            body: {
              error: job.errorMessage ?? 'The video provider rejected this job under its content policy',
              code: job.errorCode,
              creditsRefunded: job.refunded,
              ...(job.recommendedModel ? { recommendedModel: job.recommendedModel } : {}),
            },
          });
        }
        throw new ApiError(500, VIDEO_MESSAGES.failed, { code: job.errorCode ?? 'INFERENCE_FAILED' });
      }
      const executionMs = Math.max(0, (job.finishedAtMs ?? now()) - job.createdAtMs);
      const typical =
        (await deps.jobs.typicalDurationMs(job.modelId)) ??
        (job.params as StoredVideoParams).durationSeconds * 1000 * 2;
      if (job.status !== 'completed') {
        return {
          kind: 'status',
          job,
          body: { status: 'PROCESSING', average_execution_time: typical, execution_duration: executionMs },
        };
      }
      const link = model?.video?.downloadUrl ? downloadUrlOf(job) : undefined;
      if (link) {
        return {
          kind: 'status',
          job,
          body: {
            status: 'COMPLETED',
            average_execution_time: typical,
            execution_duration: executionMs,
            download_url: link,
          },
        };
      }
      const media = await deps.jobs.getMedia(job.id);
      if (!media) throw notFound(VIDEO_MESSAGES.notFound, 'MEDIA_NOT_FOUND');
      if (input.deleteMedia) await deps.jobs.delete(job.id);
      return { kind: 'video', bytes: media.bytes, contentType: media.contentType, job };
    },

    async complete(input: { principal: Principal; model: string; queueId: string }): Promise<boolean> {
      const job = await ownedJob(input.principal, input.model, input.queueId);
      if (job.status === 'failed' && !job.refunded) await refundJob(deps, job);
      return deps.jobs.delete(job.id);
    },

    /**
     * The video behind a download link, when the token matches and the link has not expired; undefined for an
     * unknown, unfinished, deleted or expired job or a wrong token. `revoke` deletes the job and its media.
     */
    async download(input: { jobId: string; token: string; revoke?: boolean }) {
      const job = await deps.jobs.get(input.jobId);
      const expected = (job?.params as StoredVideoParams | undefined)?.downloadToken;
      if (!job || !expected || job.expiresAtMs <= now()) return undefined;
      const a = Buffer.from(expected);
      const b = Buffer.from(input.token);
      if (a.length !== b.length || !timingSafeEqual(a, b)) return undefined;
      if (input.revoke) return (await deps.jobs.delete(job.id)) ? { revoked: true as const } : undefined;
      if (job.status !== 'completed') return undefined;
      const media = await deps.jobs.getMedia(job.id);
      return media ? { media } : undefined;
    },
  };
}
