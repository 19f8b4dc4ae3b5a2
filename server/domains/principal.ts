/** Narrowing of the caller for handlers whose operation only takes one kind of credential. */
import type { ApiKeyPrincipal, Principal } from '../http/auth.ts';
import { unauthorized } from '../http/errors.ts';

/** The API-key caller of an operation that only accepts keys (authentication already enforced this). */
export function requireApiKeyPrincipal(principal: Principal | undefined): ApiKeyPrincipal {
  if (principal?.kind !== 'apiKey') throw unauthorized('An API key is required', 'AUTHENTICATION_REQUIRED');
  return principal;
}
