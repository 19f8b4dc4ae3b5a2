/**
 * Builds express-openapi-validator's request validation of every operation before a client's request has to.
 *
 * The validator builds an operation's validation on its first request (per method, route and content type):
 * two Ajv schemas, each embedding the whole document, traversed and compiled. That is 30 to 200 ms of the
 * event loop per operation on the VM of bench/HISTORY.md's twenty-seventh round (about 200 ms for the chat's,
 * whose first request took 210 to 290 ms against 40 to 80 once it was built), and every request that arrives
 * meanwhile waits for it: a burst of streamed chats on a fresh process all started that much later.
 *
 * Here each operation gets one request at start, on loopback, to a private Express app that runs the same
 * middlewares (their caches are their own, whichever app runs them) and answers 204 whatever they decide:
 * no authentication, body parser of the server's, handler or database is involved. A JSON operation is sent
 * `{}` as `application/json` (what clients send: the content type is part of the validator's key, parameters
 * such as a charset included), a multipart one an empty form, the others no body and no content type (a GET
 * sent with one builds that form's on its first request). Best effort: an operation that cannot be warmed is
 * built by its first request, as before.
 */
import type { AddressInfo } from 'node:net';
import express, { type NextFunction, type Request, type RequestHandler, type Response } from 'express';
import { BASE_PATH, type Contract } from './spec.ts';

type WarmOperation = { method: string; path: string; contentType: string | undefined };

const BOUNDARY = 'warmup';

/** The request that builds an operation's validation: its path with a placeholder for each parameter. */
function warmOperations(contract: Contract): WarmOperation[] {
  const paths = contract.document.paths;
  return contract.operations.map((op) => {
    const item = paths[op.path] as Record<string, { requestBody?: unknown }> | undefined;
    const content = requestContent(contract, item?.[op.method.toLowerCase()]?.requestBody);
    return {
      method: op.method,
      path: `${BASE_PATH}${op.path.replace(/\{[^/}]+\}/g, 'x')}`,
      contentType: content.includes('application/json')
        ? 'application/json'
        : content.includes('multipart/form-data')
          ? `multipart/form-data; boundary=${BOUNDARY}`
          : undefined,
    };
  });
}

/** The media types of a request body (followed through a `#/components/requestBodies/…` reference). */
function requestContent(contract: Contract, body: unknown): string[] {
  let found = body as { $ref?: string; content?: Record<string, unknown> } | undefined;
  if (found?.$ref) {
    const name = found.$ref.replace(/^.*\//, '');
    const components = contract.document.components as
      | { requestBodies?: Record<string, typeof found> }
      | undefined;
    found = components?.requestBodies?.[name];
  }
  return Object.keys(found?.content ?? {});
}

/**
 * Sends each operation of `contract` through `validator` (the middlewares of `OpenApiValidator.middleware`,
 * with what the server adds among them) once. Resolves with how many were sent and how long it took.
 */
export async function warmRequestValidation(
  validator: readonly RequestHandler[],
  contract: Contract,
): Promise<{ operations: number; ms: number }> {
  const started = performance.now();
  const app = express();
  app.use(express.json({ limit: '1kb' }), ...validator, (_req: Request, res: Response) => {
    res.status(204).end();
  });
  app.use((_error: unknown, _req: Request, res: Response, _next: NextFunction) => {
    res.status(204).end();
  });
  // `exclusive`: in a cluster worker, a port of its own, not one the primary would share among the workers
  // (with PORT=0, that of their servers).
  const server = app.listen({ port: 0, host: '127.0.0.1', exclusive: true });
  let operations = 0;
  try {
    await new Promise<void>((resolve, reject) => {
      server.once('listening', resolve);
      server.once('error', reject);
    });
    const origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    for (const op of warmOperations(contract)) {
      const body =
        op.contentType === undefined
          ? undefined
          : op.contentType.startsWith('multipart/')
            ? `--${BOUNDARY}--\r\n`
            : '{}';
      const answer = await fetch(`${origin}${op.path}`, {
        method: op.method,
        ...(op.contentType ? { headers: { 'content-type': op.contentType } } : {}),
        ...(body === undefined ? {} : { body }),
      }).catch(() => undefined);
      await answer?.arrayBuffer().catch(() => undefined);
      if (answer) operations++;
    }
  } finally {
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
  return { operations, ms: performance.now() - started };
}
