/**
 * The x402 wallet-credit operations: the wallet's balance and ledger history (signed-in wallet only, and only
 * its own), and the top-up (delegated to the top-up service).
 */

import type { Principal, WalletPrincipal } from '../../http/auth.ts';
import type { HandlerTable } from '../../http/contract.ts';
import { ApiError, unauthorized } from '../../http/errors.ts';
import { nanoToUsdNumber } from '../../money.ts';
import { normalizeWalletAddress } from '../../storage/accounts.ts';
import type { LedgerRepository } from '../../storage/ledger.ts';
import { MINIMUM_BALANCE_NANO, MINIMUM_TOP_UP_USD, SUGGESTED_TOP_UP_USD } from './payment-required.ts';

export type WalletHandlersDeps = {
  ledger: LedgerRepository;
  topUpX402Balance?: HandlerTable['topUpX402Balance'];
};

/** The signed-in wallet, which must be the wallet of the path (403 otherwise). */
export function ownWallet(principal: Principal | undefined, walletAddress: string): WalletPrincipal {
  if (principal?.kind !== 'wallet') throw unauthorized('Sign-In-With-X required', 'AUTHENTICATION_REQUIRED');
  if (normalizeWalletAddress(principal.walletAddress) !== normalizeWalletAddress(walletAddress)) {
    throw new ApiError(403, 'The signed-in wallet does not match the wallet address in the path', {
      code: 'X402_WALLET_MISMATCH',
    });
  }
  return principal;
}

export function createWalletHandlers(
  deps: WalletHandlersDeps,
): Pick<HandlerTable, 'getX402Balance' | 'listX402Transactions'> &
  Partial<Pick<HandlerTable, 'topUpX402Balance'>> {
  const { ledger } = deps;

  /** Spendable USD credit: the balance minus what in-flight requests hold. */
  async function spendable(accountId: string) {
    const balance = await ledger.getBalance(accountId);
    return { usdNano: balance.usdAvailableNano, diemNano: balance.diemAvailableNano };
  }

  return {
    async getX402Balance(ctx) {
      const wallet = ownWallet(ctx.principal, ctx.path.walletAddress);
      const { usdNano, diemNano } = await spendable(wallet.accountId);
      return {
        status: 200,
        body: {
          success: true,
          data: {
            walletAddress: wallet.walletAddress,
            balanceUsd: nanoToUsdNumber(usdNano),
            canConsume: usdNano + diemNano >= MINIMUM_BALANCE_NANO,
            minimumTopUpUsd: MINIMUM_TOP_UP_USD,
            suggestedTopUpUsd: SUGGESTED_TOP_UP_USD,
            diemBalanceUsd: nanoToUsdNumber(diemNano),
          },
        },
      };
    },

    async listX402Transactions(ctx) {
      const wallet = ownWallet(ctx.principal, ctx.path.walletAddress);
      const limit = ctx.query.limit ?? 50;
      const offset = ctx.query.offset ?? 0;
      // One extra row tells whether another page follows.
      const [rows, { usdNano }] = await Promise.all([
        ledger.listEntries(wallet.accountId, { limit: limit + 1, offset }),
        spendable(wallet.accountId),
      ]);
      return {
        status: 200,
        body: {
          success: true,
          data: {
            walletAddress: wallet.walletAddress,
            currentBalance: nanoToUsdNumber(usdNano),
            transactions: rows.slice(0, limit).map((entry) => ({
              id: entry.id,
              amount: nanoToUsdNumber(entry.amountNano),
              balanceAfter: nanoToUsdNumber(entry.balanceAfterNano),
              type: entry.type,
              createdAt: new Date(entry.createdAtMs).toISOString(),
              requestId: entry.requestId,
              modelId: entry.modelId,
            })),
            pagination: { limit, offset, hasMore: rows.length > limit },
          },
        },
      };
    },

    ...(deps.topUpX402Balance ? { topUpX402Balance: deps.topUpX402Balance } : {}),
  };
}
