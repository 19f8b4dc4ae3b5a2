/**
 * The operator CLI: `npm run admin -- <command> [options]`. Works on the database of DATABASE_URL (the same
 * variable the server reads), applying migrations first. `--json` prints machine-readable output.
 */
import { parseArgs } from 'node:util';
import { loadConfig } from '../server/config.ts';
import { formatNanoUsd, parseUsdToNano } from '../server/money.ts';
import {
  type ApiKeyType,
  createAccounts,
  createApiKeys,
  createDatabase,
  createLedger,
  migrate,
} from '../server/storage/index.ts';

const HELP = `Usage: npm run admin -- <command> [options]

Commands:
  create-account [--name NAME] [--pro] [--key-types ADMIN,INFERENCE]
                              create an account and its API keys; prints each secret once
  credit <accountId> <usd> [--note TEXT]
                              add USD credit (a TOP_UP ledger entry)
  set-diem <accountId> <diem> set the DIEM stake: that many USD of credit per UTC day, spent before USD
  list-accounts [--kind api|wallet] [--limit N]
                              accounts with their balances
  list-keys <accountId>       the account's API keys (never the secrets)
  revoke-key <keyId>          revoke an API key; it stops authenticating at once

Options:
  --json                      print JSON instead of text
  --help                      this help

Environment: DATABASE_URL (default sqlite:./data/service.db).`;

class UsageError extends Error {}

function amount(value: string | undefined, what: string): bigint {
  if (value === undefined) throw new UsageError(`Missing ${what}`);
  try {
    return parseUsdToNano(value);
  } catch {
    throw new UsageError(`${what} must be a non-negative decimal such as 25 or 2.50, got "${value}"`);
  }
}

function parseOptions(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      help: { type: 'boolean' },
      json: { type: 'boolean' },
      name: { type: 'string' },
      pro: { type: 'boolean' },
      'key-types': { type: 'string' },
      note: { type: 'string' },
      kind: { type: 'string' },
      limit: { type: 'string' },
    },
  });
}

async function main(argv: string[]): Promise<number> {
  let parsed: ReturnType<typeof parseOptions>;
  try {
    parsed = parseOptions(argv);
  } catch (error) {
    throw new UsageError(error instanceof Error ? error.message : String(error));
  }
  const { values, positionals } = parsed;
  const [command, ...args] = positionals;
  if (values.help || !command) {
    console.log(HELP);
    return values.help ? 0 : 2;
  }
  const print = (text: string, data: unknown) =>
    console.log(
      values.json ? JSON.stringify(data, (_k, v) => (typeof v === 'bigint' ? v.toString() : v), 2) : text,
    );

  const config = loadConfig(process.env);
  const database = await createDatabase(config.databaseUrl, {
    preparedStatements: config.databasePreparedStatements,
  });
  try {
    await migrate(database);
    const accounts = createAccounts(database);
    const keys = createApiKeys(database);
    const ledger = createLedger(database);

    switch (command) {
      case 'create-account': {
        const types = (values['key-types'] ?? 'ADMIN,INFERENCE')
          .split(',')
          .map((t) => t.trim().toUpperCase());
        for (const t of types)
          if (t !== 'ADMIN' && t !== 'INFERENCE') throw new UsageError(`Unknown key type ${t}`);
        const account = await accounts.createApiAccount({
          name: values.name ?? null,
          pro: values.pro ?? false,
        });
        const created = [];
        for (const keyType of types as ApiKeyType[]) {
          const { key, secret } = await keys.create({
            accountId: account.id,
            keyType,
            description: `${keyType === 'ADMIN' ? 'Admin' : 'Inference'} key`,
          });
          created.push({ id: key.id, type: keyType, secret });
        }
        print(
          [
            `Account ${account.id}${account.name ? ` (${account.name})` : ''}`,
            ...created.map((k) => `  ${k.type.padEnd(9)} key ${k.id}: ${k.secret}`),
            'The secrets are shown only this once.',
          ].join('\n'),
          { account, keys: created },
        );
        return 0;
      }
      case 'credit': {
        const [accountId, usd] = args;
        if (!accountId) throw new UsageError('Usage: credit <accountId> <usd>');
        const nano = amount(usd, 'the amount');
        if (nano === 0n) throw new UsageError('The amount must be more than 0');
        await accounts.get(accountId);
        const { entry } = await ledger.topUp({
          accountId,
          amountNano: nano,
          network: 'operator',
          txHash: crypto.randomUUID(),
          note: values.note ?? 'Operator credit',
        });
        print(
          `Credited ${formatNanoUsd(nano)} USD; balance ${formatNanoUsd(entry.balanceAfterNano)} USD (entry ${entry.id})`,
          entry,
        );
        return 0;
      }
      case 'set-diem': {
        const [accountId, diem] = args;
        if (!accountId) throw new UsageError('Usage: set-diem <accountId> <diem>');
        const account = await accounts.setDiemStake(accountId, amount(diem, 'the DIEM stake'));
        print(
          `Account ${account.id} now has ${formatNanoUsd(account.diemStakeNano)} DIEM of credit per day`,
          account,
        );
        return 0;
      }
      case 'list-accounts': {
        const limit = values.limit === undefined ? 100 : Number(values.limit);
        if (!Number.isInteger(limit) || limit < 1) throw new UsageError('--limit must be a positive integer');
        if (values.kind !== undefined && values.kind !== 'api' && values.kind !== 'wallet') {
          throw new UsageError('--kind must be api or wallet');
        }
        const list = await accounts.list({ limit, ...(values.kind ? { kind: values.kind } : {}) });
        const rows = await Promise.all(
          list.map(async (a) => ({ ...a, balance: await ledger.getBalance(a.id) })),
        );
        print(
          rows.length === 0
            ? 'No accounts.'
            : rows
                .map(
                  (r) =>
                    `${r.id}  ${r.kind.padEnd(6)} ${formatNanoUsd(r.balance.usdNano).padStart(14)} USD  ` +
                    `${formatNanoUsd(r.diemStakeNano)} DIEM/day  ${r.walletAddress ?? r.name ?? ''}`,
                )
                .join('\n'),
          rows,
        );
        return 0;
      }
      case 'list-keys': {
        const [accountId] = args;
        if (!accountId) throw new UsageError('Usage: list-keys <accountId>');
        await accounts.get(accountId);
        const list = await keys.list(accountId, { includeRevoked: true });
        print(
          list.length === 0
            ? 'No keys.'
            : list
                .map(
                  (k) =>
                    `${k.id}  ${k.keyType.padEnd(9)} …${k.last6}  ${k.revokedAtMs ? 'revoked' : 'active '}  ${k.description}`,
                )
                .join('\n'),
          list,
        );
        return 0;
      }
      case 'revoke-key': {
        const [keyId] = args;
        if (!keyId) throw new UsageError('Usage: revoke-key <keyId>');
        const key = await keys.revoke(keyId);
        print(`Key ${key.id} (…${key.last6}) is revoked`, key);
        return 0;
      }
      default:
        throw new UsageError(`Unknown command "${command}"\n\n${HELP}`);
    }
  } finally {
    await database.close();
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error: unknown) => {
    if (error instanceof UsageError) {
      console.error(error.message);
      process.exit(2);
    }
    console.error(error instanceof Error ? error.message : String(error));
    process.exit(1);
  },
);
