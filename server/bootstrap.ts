/**
 * First-start set-up, so that `npm ci && npm start` is immediately useful:
 * - with ADMIN_API_KEY set, an ADMIN key with exactly that secret exists (created once, on its own account);
 * - with an empty database and no ADMIN_API_KEY, an ADMIN key is generated and its secret printed once;
 * - the bootstrap account is credited BOOTSTRAP_BALANCE_USD once, as a TOP_UP ledger entry.
 * Crediting is keyed like a payment, (`bootstrap`, account id), so restarts and racing instances credit once.
 */
import { parseUsdToNano } from './money.ts';
import type { AccountsRepository } from './storage/accounts.ts';
import type { ApiKeysRepository } from './storage/api-keys.ts';
import type { LedgerRepository } from './storage/ledger.ts';

export type BootstrapDeps = {
  accounts: AccountsRepository;
  keys: ApiKeysRepository;
  ledger: LedgerRepository;
};

export type BootstrapOptions = {
  adminApiKey: string | undefined;
  bootstrapBalanceUsd: string;
};

export type BootstrapResult =
  | { action: 'none' }
  | { action: 'configured-key'; accountId: string; credited: boolean }
  | { action: 'generated-key'; accountId: string; secret: string; credited: boolean };

export async function bootstrap(deps: BootstrapDeps, options: BootstrapOptions): Promise<BootstrapResult> {
  const amountNano = parseUsdToNano(options.bootstrapBalanceUsd);
  const credit = async (accountId: string) => {
    if (amountNano === 0n) return false;
    const { credited } = await deps.ledger.topUp({
      accountId,
      amountNano,
      network: 'bootstrap',
      txHash: accountId,
      note: 'Bootstrap balance',
    });
    return credited;
  };

  if (options.adminApiKey) {
    const existing = await deps.keys.authenticate(options.adminApiKey);
    if (existing.ok) return { action: 'configured-key', accountId: existing.key.accountId, credited: false };
    if (existing.reason !== 'unknown') {
      throw new Error(`ADMIN_API_KEY is the secret of a ${existing.reason} key; configure a new secret`);
    }
    const account = await deps.accounts.createApiAccount({ name: 'Bootstrap account' });
    const { key } = await deps.keys.ensureKeyWithSecret(account.id, 'ADMIN', options.adminApiKey, {
      description: 'Bootstrap admin key',
    });
    return { action: 'configured-key', accountId: key.accountId, credited: await credit(key.accountId) };
  }

  const [any] = await deps.accounts.list({ limit: 1 });
  if (any) return { action: 'none' };
  const account = await deps.accounts.createApiAccount({ name: 'Bootstrap account' });
  const { secret } = await deps.keys.create({
    accountId: account.id,
    keyType: 'ADMIN',
    description: 'Bootstrap admin key',
  });
  return { action: 'generated-key', accountId: account.id, secret, credited: await credit(account.id) };
}
