/**
 * Opt-in response validation for the typed client: every response the client receives (JSON operations through
 * openapi-fetch, the stream and binary helpers) is handed to a `ResponseValidation` with the operation's path
 * template, and every streamed chat chunk to its `chunk` check. A check throws to reject the response; the
 * client call then rejects with that error. The client itself carries no schema validator: the caller brings
 * one (the contract suites pass one built on the bundled contract, test/support/client-validation.ts).
 */
import type { Middleware } from 'openapi-fetch';

/** A response as the validation sees it. */
export type CheckedResponse = {
  /** Upper-case HTTP method. */
  method: string;
  /** The contract's path template, e.g. `/characters/{slug}`. */
  path: string;
  status: number;
  headers: Headers;
  /** How the body was read: JSON (parsed), text, or not read (binary bytes, an event stream). */
  kind: 'json' | 'text' | 'binary' | 'stream' | 'empty';
  /** The parsed JSON or the text; undefined for binary and stream bodies. */
  body?: unknown;
};

export type ResponseValidation = {
  /** Checks each response; throws to reject it. */
  response(response: CheckedResponse): void | Promise<void>;
  /** Checks each streamed chat-completion chunk; throws to reject it. */
  chunk?(chunk: unknown): void | Promise<void>;
};

/** Thrown by a validation that found the response outside the contract. */
export class ContractViolationError extends Error {
  override readonly name = 'ContractViolationError';
  readonly problems: readonly string[];
  constructor(what: string, problems: readonly string[]) {
    super(`${what} violates the contract:\n- ${problems.join('\n- ')}`);
    this.problems = problems;
  }
}

/** Reads a copy of the body as the validation needs it, leaving the response itself unread. */
export async function checkedResponse(
  method: string,
  path: string,
  response: Response,
  streamed = false,
): Promise<CheckedResponse> {
  const base = { method: method.toUpperCase(), path, status: response.status, headers: response.headers };
  const mediaType = (response.headers.get('content-type') ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  if (response.status === 204 || response.headers.get('content-length') === '0')
    return { ...base, kind: 'empty' };
  if (mediaType === 'application/json' || mediaType.endsWith('+json')) {
    const text = await response.clone().text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      return { ...base, kind: 'text', body: text };
    }
    return { ...base, kind: 'json', body };
  }
  if (mediaType === 'text/event-stream' && streamed) return { ...base, kind: 'stream' };
  if (mediaType.startsWith('text/')) return { ...base, kind: 'text', body: await response.clone().text() };
  return { ...base, kind: 'binary' };
}

/** The openapi-fetch middleware that runs the validation on every JSON-operation response. */
export function validationMiddleware(validation: ResponseValidation): Middleware {
  return {
    async onResponse({ request, response, schemaPath }) {
      await validation.response(await checkedResponse(request.method, schemaPath, response));
      return undefined;
    },
  };
}
