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
import type { TopUpService } from './top-up.ts';

export type WalletHandlersDeps = {
  ledger: LedgerRepository;
  publicOrigin: string;
  /** Undefined when no facilitator or pay-to address is configured: the top-up answers 503. */
  topUp: TopUpService | undefined;
};

/** The payment header under its current or legacy names. */
function paymentHeader(headers: Record<string, string | string[] | undefined>): string | undefined {
  const value = headers['payment-signature'] ?? headers['x-402-payment'] ?? headers['x-payment'];
  return Array.isArray(value) ? value[0] : value;
}

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
): Pick<HandlerTable, 'getX402Balance' | 'listX402Transactions' | 'topUpX402Balance'> {
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

    async topUpX402Balance(ctx) {
      if (!deps.topUp) {
        throw new ApiError(
          503,
          'Wallet top-up is not configured on this server: set X402_PAY_TO_BASE or X402_PAY_TO_SOLANA and a facilitator (X402_FACILITATOR_URL, or X402_BASE_RPC_URL with X402_FACILITATOR_PRIVATE_KEY, or X402_SOLANA_RPC_URL with X402_SOLANA_FACILITATOR_PRIVATE_KEY)',
          { code: 'X402_NOT_CONFIGURED' },
        );
      }
      const amountUsd = ctx.body?.amountUsd;
      const resourceUrl = `${deps.publicOrigin}/api/v1/x402/top-up`;
      const header = paymentHeader(ctx.headers);
      if (!header) {
        const offer = await deps.topUp.offer(amountUsd, resourceUrl);
        throw new ApiError(402, offer.body.error, {
          body: offer.body,
          headers: { 'PAYMENT-REQUIRED': offer.header },
        });
      }
      return deps.topUp.pay(header, amountUsd, resourceUrl);
    },
  };
}
