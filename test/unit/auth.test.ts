/**
 * resolvePrincipal (server/http/auth.ts): the caller at once when nothing has to be looked up or verified (a
 * cached key, an anonymous call to a public operation), a promise otherwise; a refusal known at once is thrown,
 * one found by a lookup rejects, with the same ApiError either way.
 */
import type { Request } from 'express';
import { describe, expect, test } from 'vitest';
import type { ApiKeyPrincipal, AuthPorts } from '../../server/http/auth.ts';
import { resolvePrincipal } from '../../server/http/auth.ts';
import { ApiError } from '../../server/http/errors.ts';
import type { OperationInfo } from '../../server/http/spec.ts';

const operation = (overrides: Partial<OperationInfo> = {}): OperationInfo => ({
  operationId: 'createChatCompletion',
  summary: 'chat',
  method: 'POST',
  path: '/chat/completions',
  security: [{ BearerAuth: [] }, { siwx: [] }],
  requiredKeyType: undefined,
  declaresPaymentRequired: false,
  pattern: /^\/chat\/completions$/,
  ...overrides,
});

const inference: ApiKeyPrincipal = { kind: 'apiKey', accountId: 'a', keyId: 'k', keyType: 'INFERENCE' };
const request = (authorization?: string) =>
  ({ headers: authorization === undefined ? {} : { authorization } }) as unknown as Request;

/** Ports whose key lookup answers at once (`cached`) or as a promise. */
function ports(known: Record<string, ApiKeyPrincipal>, cached: boolean): AuthPorts {
  return {
    authenticateApiKey: (secret) => (cached ? known[secret] : Promise.resolve(known[secret])),
    paymentRequired: () => ({ body: { error: 'Payment required' }, header: 'e30=' }),
  };
}

const isPromise = (value: unknown) => typeof (value as { then?: unknown } | undefined)?.then === 'function';

/** What resolvePrincipal answered or threw, and whether it did so at once. */
async function outcome(answer: () => unknown) {
  try {
    const value = answer();
    const atOnce = !isPromise(value);
    try {
      return { atOnce, value: await value };
    } catch (error) {
      return { atOnce, error };
    }
  } catch (error) {
    return { atOnce: true, error };
  }
}

describe('resolvePrincipal', () => {
  test('a cached key: the principal itself, no promise; a looked-up key: a promise of the same', async () => {
    const known = { s: inference };
    expect(
      await outcome(() => resolvePrincipal(request('Bearer s'), operation(), ports(known, true))),
    ).toEqual({
      atOnce: true,
      value: inference,
    });
    expect(
      await outcome(() => resolvePrincipal(request('Bearer s'), operation(), ports(known, false))),
    ).toEqual({ atOnce: false, value: inference });
  });

  test('an unknown key and an inference key on an admin operation: the same 401 at once or after the lookup', async () => {
    const admin = operation({
      operationId: 'listApiKeys' as OperationInfo['operationId'],
      requiredKeyType: 'ADMIN',
    });
    for (const cached of [true, false]) {
      const unknown = await outcome(() =>
        resolvePrincipal(request('Bearer x'), operation(), ports({}, cached)),
      );
      expect(unknown.atOnce).toBe(cached);
      expect(unknown.error).toBeInstanceOf(ApiError);
      expect(unknown.error).toMatchObject({ status: 401 });
      const refused = await outcome(() =>
        resolvePrincipal(request('Bearer s'), admin, ports({ s: inference }, cached)),
      );
      expect(refused.atOnce).toBe(cached);
      expect(refused.error).toMatchObject({ status: 401, message: 'Admin API key required' });
    }
  });

  test('no credentials: undefined at once on a public operation, the 401 or the 402 thrown at once elsewhere', async () => {
    const known = { s: inference };
    expect(
      await outcome(() =>
        resolvePrincipal(request(), operation({ security: [{}, { BearerAuth: [] }] }), ports(known, false)),
      ),
    ).toEqual({ atOnce: true, value: undefined });
    const missing = await outcome(() => resolvePrincipal(request(), operation(), ports(known, false)));
    expect(missing).toMatchObject({ atOnce: true, error: { status: 401, code: 'AUTHENTICATION_REQUIRED' } });
    const paid = await outcome(() =>
      resolvePrincipal(request(), operation({ declaresPaymentRequired: true }), ports(known, false)),
    );
    expect(paid).toMatchObject({
      atOnce: true,
      error: { status: 402, headers: { 'PAYMENT-REQUIRED': 'e30=' } },
    });
    const malformed = await outcome(() =>
      resolvePrincipal(request('Bearer'), operation(), ports(known, true)),
    );
    expect(malformed).toMatchObject({ atOnce: true, error: { status: 401 } });
  });
});
