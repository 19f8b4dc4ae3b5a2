/**
 * One throwaway PostgreSQL server for a whole test file (test/support/postgres.ts): started before its tests,
 * stopped after them, also when they fail. Kept apart from postgres.ts, which the benchmark tools import
 * outside vitest.
 */
import { afterAll, beforeAll } from 'vitest';
import { type StartedPostgres, startPostgres } from './postgres.ts';

/** Registers the file's hooks; the getter answers the running server (inside a test or a hook after them). */
export function postgresPerFile(): () => StartedPostgres {
  let started: StartedPostgres | undefined;
  beforeAll(async () => {
    started = await startPostgres();
  }, 120_000);
  afterAll(async () => {
    await started?.stop();
  });
  return () => {
    if (!started) throw new Error('PostgreSQL is not started (call the getter inside a test)');
    return started;
  };
}
