/**
 * The operator CLI, run as an operator would (`npm run admin -- …` is `tsx scripts/admin.ts …`), on a
 * temporary SQLite database.
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { createApiKeys, createDatabase } from '../../server/storage/index.ts';
import { repoRoot } from '../support/contract.ts';

const dir = mkdtempSync(join(tmpdir(), 'admin-cli-'));
const DATABASE_URL = `sqlite:${join(dir, 'cli.db')}`;
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function admin(...args: string[]) {
  const r = spawnSync(process.execPath, ['--import', 'tsx', join(repoRoot, 'scripts', 'admin.ts'), ...args], {
    cwd: repoRoot,
    env: { ...process.env, DATABASE_URL },
    encoding: 'utf8',
  });
  return { code: r.status, out: r.stdout, err: r.stderr };
}

describe('npm run admin', () => {
  test('behavior: --help lists every command', () => {
    const r = admin('--help');
    expect(r.code).toBe(0);
    for (const command of [
      'create-account',
      'credit',
      'set-diem',
      'list-accounts',
      'list-keys',
      'revoke-key',
    ]) {
      expect(r.out).toContain(command);
    }
  });

  test('behavior: create an account with keys, credit it, stake DIEM, list, revoke', {
    timeout: 60_000,
  }, async () => {
    const created = admin('create-account', '--name', 'Acme', '--json');
    expect(created.code).toBe(0);
    const { account, keys } = JSON.parse(created.out) as {
      account: { id: string };
      keys: { id: string; type: string; secret: string }[];
    };
    expect(keys.map((k) => k.type)).toEqual(['ADMIN', 'INFERENCE']);

    expect(admin('credit', account.id, '25.50').code).toBe(0);
    expect(admin('set-diem', account.id, '3').code).toBe(0);
    const listed = JSON.parse(admin('list-accounts', '--json').out) as {
      id: string;
      balance: { usdNano: string };
      diemStakeNano: string;
    }[];
    const row = listed.find((a) => a.id === account.id);
    expect(row?.balance.usdNano).toBe('25500000000');
    expect(row?.diemStakeNano).toBe('3000000000');

    const inference = keys.find((k) => k.type === 'INFERENCE');
    expect(admin('list-keys', account.id).out).toContain(inference?.secret.slice(-6));
    expect(admin('list-keys', account.id).out).not.toContain(inference?.secret);
    expect(admin('revoke-key', inference?.id ?? '').code).toBe(0);

    const database = await createDatabase(DATABASE_URL);
    try {
      const result = await createApiKeys(database).authenticate(inference?.secret ?? '');
      expect(result).toEqual({ ok: false, reason: 'revoked' });
    } finally {
      await database.close();
    }
  });

  test('behavior: bad input is a usage error (exit 2) with a clear message, and changes nothing', () => {
    const negative = admin('credit', 'some-account', 'minus-five');
    expect(negative.code).toBe(2);
    expect(negative.err).toContain('non-negative decimal');
    expect(admin('frobnicate').code).toBe(2);
    expect(admin('list-accounts', '--limit', 'x').code).toBe(2);
    const unknown = admin('credit', '00000000-0000-4000-8000-000000000000', '5');
    expect(unknown.code).toBe(1);
  });
});
