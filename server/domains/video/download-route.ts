/**
 * The pre-signed download links of video models that deliver through one (`video.downloadUrl` in the
 * catalogue): `GET /media/video/{queue_id}.mp4?expires=…&token=…` answers the finished MP4, `DELETE` on the same
 * link revokes it (deletes the job and its media). The link's secret is stored with the job, so any instance
 * serves it. Outside the API base path and the contract: the link itself is the credential.
 */
import type express from 'express';
import { DOWNLOAD_PATH, type VideoService } from './service.ts';

export function mountVideoDownloads(router: express.Router, deps: { video: VideoService }): void {
  const route = `${DOWNLOAD_PATH}/:file`;
  const notFound = (res: express.Response): void => {
    res.status(404).json({ error: 'Media could not be found. Request may be invalid, expired, or deleted.' });
  };
  const parse = (req: express.Request) => {
    const match = /^([A-Za-z0-9-]{1,64})\.mp4$/.exec(String(req.params.file ?? ''));
    const token = typeof req.query.token === 'string' ? req.query.token : '';
    return match?.[1] && token ? { jobId: match[1], token } : undefined;
  };
  router.get(route, (req, res, next) => {
    const link = parse(req);
    if (!link) {
      notFound(res);
      return;
    }
    deps.video
      .download(link)
      .then((found) => {
        const media = found && 'media' in found ? found.media : undefined;
        if (!media) notFound(res);
        else res.status(200).type(media.contentType).send(media.bytes);
      })
      .catch(next);
  });
  router.delete(route, (req, res, next) => {
    const link = parse(req);
    if (!link) {
      notFound(res);
      return;
    }
    deps.video
      .download({ ...link, revoke: true })
      .then((found) => {
        if (found) res.status(200).json({ success: true });
        else notFound(res);
      })
      .catch(next);
  });
}
