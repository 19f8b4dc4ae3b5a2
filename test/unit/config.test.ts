import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, test } from 'vitest';
import { CONFIG_VARIABLES, ConfigError, loadConfig } from '../../server/config.ts';
import { repoRoot } from '../support/contract.ts';

describe('loadConfig', () => {
  test('behavior: no variables at all gives the embedded defaults', () => {
    const config = loadConfig({});
    expect(config).toMatchObject({
      port: 3000,
      host: '127.0.0.1',
      databaseUrl: 'sqlite:./data/service.db',
      publicOrigin: 'http://127.0.0.1:3000',
      bootstrapBalanceUsd: '10',
      validateResponses: true,
      databasePreparedStatements: true,
      sqliteCheckpointIntervalMs: 10,
      idlePollUs: 500,
    });
    expect(loadConfig({ DATABASE_PREPARED_STATEMENTS: 'false' }).databasePreparedStatements).toBe(false);
  });

  test('behavior: DATABASE_ACCOUNT_BATCH is a whole number from 1 (each statement alone) to 100, 8 by default', () => {
    expect(loadConfig({}).databaseAccountBatch).toBe(8);
    expect(loadConfig({ DATABASE_ACCOUNT_BATCH: '1' }).databaseAccountBatch).toBe(1);
    for (const bad of ['0', '2.5', 'many', '101'])
      expect(() => loadConfig({ DATABASE_ACCOUNT_BATCH: bad })).toThrow(/DATABASE_ACCOUNT_BATCH/);
  });

  test('behavior: DATABASE_ACCOUNT_CONCURRENCY is a whole number from 0 (no limit), 3 by default', () => {
    expect(loadConfig({}).databaseAccountConcurrency).toBe(3);
    expect(loadConfig({ DATABASE_ACCOUNT_CONCURRENCY: '0' }).databaseAccountConcurrency).toBe(0);
    expect(loadConfig({ DATABASE_ACCOUNT_CONCURRENCY: '8' }).databaseAccountConcurrency).toBe(8);
    for (const bad of ['-1', '2.5', 'many', '1001'])
      expect(() => loadConfig({ DATABASE_ACCOUNT_CONCURRENCY: bad })).toThrow(/DATABASE_ACCOUNT_CONCURRENCY/);
  });

  test('behavior: SQLITE_CHECKPOINT_INTERVAL_MS is a whole number of milliseconds from 1 to an hour', () => {
    expect(loadConfig({ SQLITE_CHECKPOINT_INTERVAL_MS: '250' }).sqliteCheckpointIntervalMs).toBe(250);
    for (const bad of ['0', '-5', '2.5', 'often', '3600001'])
      expect(() => loadConfig({ SQLITE_CHECKPOINT_INTERVAL_MS: bad })).toThrow(
        /SQLITE_CHECKPOINT_INTERVAL_MS/,
      );
  });

  test('behavior: IDLE_POLL_US is a whole number of µs from 0 (off) to 0.1 s', () => {
    expect(loadConfig({ IDLE_POLL_US: '0' }).idlePollUs).toBe(0);
    expect(loadConfig({ IDLE_POLL_US: '2000' }).idlePollUs).toBe(2000);
    for (const bad of ['-1', '2.5', 'always', '100001'])
      expect(() => loadConfig({ IDLE_POLL_US: bad })).toThrow(/IDLE_POLL_US/);
  });

  test('behavior: responses are validated outside production unless switched off', () => {
    expect(loadConfig({ NODE_ENV: 'production' }).validateResponses).toBe(false);
    expect(loadConfig({ NODE_ENV: 'production', VALIDATE_RESPONSES: 'true' }).validateResponses).toBe(true);
    expect(loadConfig({ VALIDATE_RESPONSES: 'off' }).validateResponses).toBe(false);
  });

  test('behavior: every problem is listed at once, and empty values count as unset', () => {
    let error: unknown;
    try {
      loadConfig({ PORT: 'eighty', DATABASE_URL: 'mysql://x', BOOTSTRAP_BALANCE_USD: '-1', HOST: '' });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ConfigError);
    const problems = (error as ConfigError).problems.join('\n');
    expect(problems).toContain('PORT');
    expect(problems).toContain('DATABASE_URL');
    expect(problems).toContain('BOOTSTRAP_BALANCE_USD');
    expect(problems).not.toContain('HOST');
  });

  test('behavior: README.md and .env.example document every variable', () => {
    const readme = readFileSync(join(repoRoot, 'README.md'), 'utf8');
    const example = readFileSync(join(repoRoot, '.env.example'), 'utf8');
    for (const name of CONFIG_VARIABLES) {
      expect(readme, `README.md documents ${name}`).toContain(`\`${name}\``);
      expect(example, `.env.example documents ${name}`).toMatch(new RegExp(`^${name}=`, 'm'));
    }
  });
});
