/**
 * Accounts: API-key accounts (created by an operator) and wallet accounts (created on a wallet's first
 * top-up or sign-in). Balances live here but only the ledger changes them.
 */
import type { Selectable } from 'kysely';
import { type Database, withChangeNoted } from './database.ts';
import { InvalidInputError, NotFoundError } from './errors.ts';
import { assertAmount, type RepositoryOptions, resolveOptions, toNumber } from './internal.ts';
import type { AccountsTable } from './schema.ts';

export type AccountKind = 'api' | 'wallet';

export type Account = {
  id: string;
  kind: AccountKind;
  /** Lowercased for EVM addresses; `null` for API accounts. */
  walletAddress: string | null;
  name: string | null;
  pro: boolean;
  usdBalanceNano: bigint;
  usdReservedNano: bigint;
  /** The daily DIEM allowance in nano-USD (1 staked DIEM = 1 USD of credit per UTC day). */
  diemStakeNano: bigint;
  createdAtMs: number;
};

export type CreateApiAccountInput = { name?: string | null; pro?: boolean };
export type FindOrCreateWalletResult = { account: Account; created: boolean };
export type ListAccountsInput = { limit?: number; offset?: number; kind?: AccountKind };

export type AccountsRepository = ReturnType<typeof createAccounts>;

/** Canonical form of a wallet address: EVM hex is lowercased; other chains' addresses are case-sensitive. */
export function normalizeWalletAddress(address: string): string {
  const trimmed = address.trim();
  if (trimmed === '') throw new InvalidInputError('walletAddress', 'Wallet address is empty');
  return /^0x[0-9a-fA-F]{40}$/.test(trimmed) ? trimmed.toLowerCase() : trimmed;
}

export function toAccount(row: Selectable<AccountsTable>): Account {
  return {
    id: row.id,
    kind: row.kind,
    walletAddress: row.wallet_address,
    name: row.name,
    pro: toNumber(row.pro) === 1,
    usdBalanceNano: row.usd_balance_nano,
    usdReservedNano: row.usd_reserved_nano,
    diemStakeNano: row.diem_stake_nano,
    createdAtMs: toNumber(row.created_at_ms),
  };
}

/** The accounts repository. */
export function createAccounts(database: Database, options: RepositoryOptions = {}) {
  const { db } = database;
  const { now, randomId } = resolveOptions(options);

  /** Returns the account, or throws NotFoundError. */
  async function get(id: string): Promise<Account> {
    const row = await db.selectFrom('accounts').selectAll().where('id', '=', id).executeTakeFirst();
    if (!row) throw new NotFoundError('account', id);
    return toAccount(row);
  }

  /** Returns the account, or `undefined`. */
  async function find(id: string): Promise<Account | undefined> {
    const row = await db.selectFrom('accounts').selectAll().where('id', '=', id).executeTakeFirst();
    return row ? toAccount(row) : undefined;
  }

  return {
    get,
    find,

    /** Creates an API-key account with zero balances. */
    async createApiAccount(input: CreateApiAccountInput = {}): Promise<Account> {
      const row = await db
        .insertInto('accounts')
        .values({
          id: randomId(),
          kind: 'api',
          wallet_address: null,
          name: input.name ?? null,
          pro: input.pro ? 1 : 0,
          usd_balance_nano: 0n,
          usd_reserved_nano: 0n,
          diem_stake_nano: 0n,
          created_at_ms: now(),
        })
        .returningAll()
        .executeTakeFirstOrThrow();
      return toAccount(row);
    },

    /** Finds the wallet's account by address. */
    async findWalletAccount(address: string): Promise<Account | undefined> {
      const row = await db
        .selectFrom('accounts')
        .selectAll()
        .where('wallet_address', '=', normalizeWalletAddress(address))
        .executeTakeFirst();
      return row ? toAccount(row) : undefined;
    },

    /**
     * Returns the wallet's account, creating it on first sight. Atomic across processes: the insert is
     * `ON CONFLICT (wallet_address) DO NOTHING` on a unique column, so concurrent callers all get one account
     * and exactly one of them sees `created: true`.
     */
    async findOrCreateWalletAccount(address: string): Promise<FindOrCreateWalletResult> {
      const walletAddress = normalizeWalletAddress(address);
      const inserted = await db
        .insertInto('accounts')
        .values({
          id: randomId(),
          kind: 'wallet',
          wallet_address: walletAddress,
          name: null,
          pro: 0,
          usd_balance_nano: 0n,
          usd_reserved_nano: 0n,
          diem_stake_nano: 0n,
          created_at_ms: now(),
        })
        .onConflict((oc) => oc.column('wallet_address').doNothing())
        .returningAll()
        .executeTakeFirst();
      if (inserted) return { account: toAccount(inserted), created: true };
      const row = await db
        .selectFrom('accounts')
        .selectAll()
        .where('wallet_address', '=', walletAddress)
        .executeTakeFirstOrThrow();
      return { account: toAccount(row), created: false };
    },

    /** Sets the daily DIEM allowance (nano-USD per UTC day). Takes effect for today's remaining allowance. */
    async setDiemStake(id: string, diemStakeNano: bigint): Promise<Account> {
      assertAmount('diemStakeNano', diemStakeNano);
      // The allowance decides what a hold may take.
      return withChangeNoted(database, async () => {
        const row = await db
          .updateTable('accounts')
          .set({ diem_stake_nano: diemStakeNano })
          .where('id', '=', id)
          .returningAll()
          .executeTakeFirst();
        if (!row) throw new NotFoundError('account', id);
        return toAccount(row);
      });
    },

    /** Marks the account pro (higher rate-limit tier) or not. */
    async setPro(id: string, pro: boolean): Promise<Account> {
      const row = await db
        .updateTable('accounts')
        .set({ pro: pro ? 1 : 0 })
        .where('id', '=', id)
        .returningAll()
        .executeTakeFirst();
      if (!row) throw new NotFoundError('account', id);
      return toAccount(row);
    },

    /** Renames the account. */
    async setName(id: string, name: string | null): Promise<Account> {
      const row = await db
        .updateTable('accounts')
        .set({ name })
        .where('id', '=', id)
        .returningAll()
        .executeTakeFirst();
      if (!row) throw new NotFoundError('account', id);
      return toAccount(row);
    },

    /** Lists accounts, oldest first. */
    async list(input: ListAccountsInput = {}): Promise<Account[]> {
      const limit = input.limit ?? 100;
      const offset = input.offset ?? 0;
      if (!Number.isSafeInteger(limit) || limit < 1) throw new InvalidInputError('limit', 'Bad limit');
      if (!Number.isSafeInteger(offset) || offset < 0) throw new InvalidInputError('offset', 'Bad offset');
      let query = db.selectFrom('accounts').selectAll();
      if (input.kind) query = query.where('kind', '=', input.kind);
      const rows = await query.orderBy('created_at_ms').orderBy('id').limit(limit).offset(offset).execute();
      return rows.map(toAccount);
    },

    /** Number of accounts (the bootstrap checks for an empty database). */
    async count(): Promise<number> {
      const row = await db
        .selectFrom('accounts')
        .select((eb) => eb.fn.countAll<number | bigint>().as('n'))
        .executeTakeFirstOrThrow();
      return toNumber(row.n);
    },
  };
}
