/**
 * The operations surface, outside the API's base path: liveness, readiness, Prometheus metrics, the bundled
 * contract and a docs page rendered from it with locally served assets (no CDN).
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import express from 'express';
import type { AppDeps } from '../app.ts';
import { defaultSpecPath } from '../http/spec.ts';

const require = createRequire(import.meta.url);
const swaggerUiDir = dirname(require.resolve('swagger-ui-dist/package.json'));

const docsPage = (title: string) => `<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>${title}</title>
  <link rel="stylesheet" href="/docs/assets/swagger-ui.css">
</head>
<body>
  <div id="docs"></div>
  <script src="/docs/assets/swagger-ui-bundle.js"></script>
  <script src="/docs/init.js"></script>
</body>
</html>`;

const docsInit = `window.ui = SwaggerUIBundle({ url: '/openapi.yaml', dom_id: '#docs', deepLinking: true,
  defaultModelsExpandDepth: 0, displayRequestDuration: true, tryItOutEnabled: false });`;

export function mountOperationsSurface(router: express.Router, deps: AppDeps): void {
  const bundle = readFileSync(defaultSpecPath);
  const title = `${String(deps.contract.document.info.title)} ${deps.contract.version}`;

  router.get('/healthz', (_req, res) => {
    res.json({ status: 'ok', version: deps.contract.version });
  });

  router.get('/readyz', async (_req, res) => {
    try {
      await deps.readiness();
      res.json({ status: 'ready' });
    } catch (error) {
      res
        .status(503)
        .json({ status: 'unavailable', error: error instanceof Error ? error.message : String(error) });
    }
  });

  router.get('/metrics', async (_req, res, next) => {
    try {
      res.type('text/plain; version=0.0.4').send(await deps.metrics.render());
    } catch (error) {
      next(error);
    }
  });

  router.get('/openapi.yaml', (_req, res) => {
    res.type('application/yaml').send(bundle);
  });

  router.get(['/docs', '/docs/'], (_req, res) => {
    res.type('text/html').send(docsPage(title));
  });
  router.get('/docs/init.js', (_req, res) => {
    res.type('text/javascript').send(docsInit);
  });
  router.use('/docs/assets', express.static(swaggerUiDir, { index: false, maxAge: '1h' }));

  router.get('/', (_req, res) => {
    res.json({
      name: deps.contract.document.info.title,
      version: deps.contract.version,
      api: '/api/v1',
      docs: '/docs',
    });
  });
}
