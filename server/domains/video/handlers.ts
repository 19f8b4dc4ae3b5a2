/**
 * `POST /video/quote`, `/video/queue`, `/video/retrieve`, `/video/complete`: thin translations between the
 * contract and the video service. Retrieve answers JSON while the job runs and the MP4 itself once it is done.
 */
import type { HandlerGroups } from '../../handlers.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError } from '../../http/errors.ts';
import type { VideoService } from './service.ts';

function caller(principal: Principal | undefined): Principal {
  // The validator's security handlers guarantee a principal on these operations; this is a guard, not a path.
  if (!principal) throw new ApiError(401, 'Authentication failed', { code: 'AUTHENTICATION_FAILED' });
  return principal;
}

export function createVideoHandlers(deps: { video: VideoService }): HandlerGroups {
  const { video } = deps;
  return {
    quoteVideo: async ({ body }) => ({ status: 200, body: { quote: video.quote(body).quote } }),

    queueVideo: async ({ body, principal, requestId }) => {
      const { response, model, backend } = await video.queue({
        body,
        principal: caller(principal),
        requestId,
      });
      return {
        status: 200,
        body: response,
        headers: {
          'x-service-model-id': model.id,
          'x-service-model-name': model.spec.name,
          'x-service-model-router': backend.name,
        },
      };
    },

    retrieveVideo: async ({ body, principal }) => {
      const result = await video.retrieve({
        principal: caller(principal),
        model: body.model,
        queueId: body.queue_id,
        deleteMedia: body.delete_media_on_completion ?? false,
      });
      const headers = {
        'x-service-model-id': result.job.modelId,
        'x-service-model-router': result.job.backend,
      };
      if (result.kind === 'video') {
        return { status: 200, contentType: result.contentType, body: result.bytes, headers };
      }
      return { status: 200, body: result.body, headers };
    },

    completeVideo: async ({ body, principal }) => ({
      status: 200,
      body: {
        success: await video.complete({
          principal: caller(principal),
          model: body.model,
          queueId: body.queue_id,
        }),
      },
    }),
  };
}
