/**
 * Resolves the caller of an operation from the spec's `security` for it, before the request is validated,
 * so that an unauthenticated caller learns nothing about the request shape:
 *
 * - `SIGN-IN-WITH-X` (or the legacy `X-Sign-In-With-X`) wins when present on an operation that takes it;
 * - otherwise `Authorization: Bearer <key>`;
 * - no credentials at all on an operation that documents 402 (inference): 402 with the x402 discovery body
 *   and the `PAYMENT-REQUIRED` header; on other protected operations: 401;
 * - an INFERENCE key on an admin-only operation: 401 `{"error":"Admin API key required"}`.
 *
 * express-openapi-validator's own security handlers cannot express these rules: it keeps only the first
 * failing scheme's status and message, and it rejects a missing header before any handler runs.
 */
import type { Request } from 'express';
import { whenReady } from '../objects.ts';
import { ApiError, adminKeyRequired, unauthorized } from './errors.ts';
import { accepts, isPublic, type OperationInfo } from './spec.ts';

export type ApiKeyPrincipal = {
  kind: 'apiKey';
  accountId: string;
  keyId: string;
  keyType: 'INFERENCE' | 'ADMIN';
  /**
   * The key had a spend limit when authentication read it (its lookup may be cached): which of the ledger's
   * one-round-trip reservations to try first on PostgreSQL. Only a hint; the ledger checks the limits itself.
   */
  spendLimited?: boolean;
};

export type WalletPrincipal = { kind: 'wallet'; accountId: string; walletAddress: string };

export type Principal = ApiKeyPrincipal | WalletPrincipal;

/**
 * The ports authentication needs; implemented over storage (keys) and the wallet domain (SIWX). Each call
 * answers a new principal object, however its lookup is cached: the request's own, so per-request state may be
 * keyed by it (the balance its reservation found, services.ts).
 */
export type AuthPorts = {
  /**
   * The principal for a bearer secret, or undefined when the key is unknown, revoked or expired: itself, not a
   * promise, when the answer is known at once (a cached key).
   */
  authenticateApiKey(secret: string): ApiKeyPrincipal | undefined | Promise<ApiKeyPrincipal | undefined>;
  /** Verifies a Sign-In-With-X header; throws an ApiError (401 with an `X402_SIGN_IN_…` code) when invalid. */
  verifySignInWithX?(header: string, req: Request): Promise<WalletPrincipal>;
  /** The 402 body for a caller without credentials, and the base64 `PAYMENT-REQUIRED` header. */
  paymentRequired(req: Request, op: OperationInfo): { body: Record<string, unknown>; header: string };
};

/** The key's principal, when there is one and it may call `op`; throws the 401 to send otherwise. */
function keyAllowed(principal: ApiKeyPrincipal | undefined, op: OperationInfo): ApiKeyPrincipal {
  if (!principal) throw unauthorized();
  if (op.requiredKeyType === 'ADMIN' && principal.keyType !== 'ADMIN') throw adminKeyRequired();
  return principal;
}

function bearerToken(req: Request): string | undefined {
  const header = req.headers.authorization;
  if (!header) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1] ?? '';
}

function signInWithX(req: Request): string | undefined {
  const value = req.headers['sign-in-with-x'] ?? req.headers['x-sign-in-with-x'];
  return Array.isArray(value) ? value[0] : value;
}

/**
 * Returns the caller, undefined for an anonymous call to a public operation, or throws the ApiError to send: at
 * once when nothing has to be looked up or verified (a cached key, an anonymous call), otherwise as a promise
 * (which rejects with the ApiError).
 */
export function resolvePrincipal(
  req: Request,
  op: OperationInfo,
  ports: AuthPorts,
): Principal | undefined | Promise<Principal | undefined> {
  const siwx = accepts(op, 'siwx') ? signInWithX(req) : undefined;
  const bearer = accepts(op, 'BearerAuth') ? bearerToken(req) : undefined;

  if (siwx !== undefined) {
    if (!ports.verifySignInWithX) {
      throw new ApiError(501, 'Not implemented: Sign-In-With-X verification', { code: 'NOT_IMPLEMENTED' });
    }
    return ports.verifySignInWithX(siwx, req);
  }
  if (bearer !== undefined) {
    if (bearer === '') throw unauthorized('Malformed Authorization header: expected "Bearer <API key>"');
    return whenReady(ports.authenticateApiKey(bearer), (found) => keyAllowed(found, op));
  }
  if (isPublic(op)) return undefined;
  if (op.declaresPaymentRequired) {
    const { body, header } = ports.paymentRequired(req, op);
    throw new ApiError(402, String(body.error ?? 'Payment required'), {
      body,
      headers: { 'PAYMENT-REQUIRED': header },
    });
  }
  throw unauthorized(
    accepts(op, 'BearerAuth')
      ? 'Authentication required: send Authorization: Bearer <API key>'
      : 'Sign-In-With-X required',
    'AUTHENTICATION_REQUIRED',
  );
}
