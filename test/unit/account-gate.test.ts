/**
 * The per-account gate of PostgreSQL's row-locking statements (server/storage/account-gate.ts): at most `limit`
 * of one account's run at once, the rest start in arrival order as places free up, a failure frees its place
 * too, and other accounts never wait. With a batch runner, the batchable statements waiting when a place frees
 * go together (one transaction); a batch undone runs each again alone, a failed commit fails them all.
 */
import { expect, test } from 'vitest';
import { BatchUndone, createAccountGate } from '../../server/storage/account-gate.ts';

/** Without batches: statements run on `'db'`. */
const ALONE = { alone: 'db' };

/** A statement that runs until `finish` is called, recording when it started. */
function pending(log: string[], name: string) {
  let finish!: (fail?: boolean) => void;
  const run = () =>
    new Promise<string>((resolve, reject) => {
      log.push(name);
      finish = (fail) => (fail ? reject(new Error(name)) : resolve(name));
    });
  return { run, finish: (fail?: boolean) => finish(fail) };
}

const turn = () => new Promise((resolve) => setImmediate(resolve));

test('behavior: at most `limit` of one account run at once; the rest start in arrival order', async () => {
  const gate = createAccountGate(2, ALONE);
  const log: string[] = [];
  const statements = ['a', 'b', 'c', 'd', 'e'].map((name) => pending(log, name));
  const results = statements.map((s) => gate('acct', s.run));
  await turn();
  expect(log).toEqual(['a', 'b']);
  statements[1]?.finish();
  await turn();
  expect(log).toEqual(['a', 'b', 'c']);
  // A failure frees its place as an answer does, and its caller sees the failure.
  const failed = expect(results[0]).rejects.toThrow('a');
  statements[0]?.finish(true);
  await turn();
  expect(log).toEqual(['a', 'b', 'c', 'd']);
  await failed;
  for (const s of statements.slice(2)) {
    s.finish();
    await turn();
  }
  expect(log).toEqual(['a', 'b', 'c', 'd', 'e']);
  expect(await Promise.all(results.slice(1))).toEqual(['b', 'c', 'd', 'e']);
});

test("behavior: another account's statements do not wait for a full account's", async () => {
  const gate = createAccountGate(1, ALONE);
  const log: string[] = [];
  const first = pending(log, 'x1');
  const second = pending(log, 'x2');
  const other = pending(log, 'y1');
  const results = [gate('x', first.run), gate('x', second.run), gate('y', other.run)];
  await turn();
  expect(log).toEqual(['x1', 'y1']);
  other.finish();
  first.finish();
  await turn();
  expect(log).toEqual(['x1', 'y1', 'x2']);
  second.finish();
  expect(await Promise.all(results)).toEqual(['x1', 'x2', 'y1']);
  // Emptied lanes start again from nothing.
  expect(await gate('x', async () => 'again')).toBe('again');
});

test('fault: a limit that is not a positive whole number is refused', () => {
  for (const bad of [0, -1, 1.5, Number.NaN]) expect(() => createAccountGate(bad, ALONE)).toThrow(RangeError);
});

/**
 * A batch runner that records what ran where: `alone` runs on 'db'; `together` runs the functions in order on
 * 'trx', then fails as `outcome` says (a statement's failure undoes the batch; a commit's error is its own).
 */
function recordingRunner(log: string[], outcome: { commitError?: Error } = {}) {
  return {
    alone: 'db',
    async together<R>(fns: Array<(q: string) => Promise<R>>): Promise<R[]> {
      log.push(`begin ${fns.length}`);
      const results: R[] = [];
      try {
        for (const fn of fns) results.push(await fn('trx'));
      } catch (error) {
        log.push('rollback');
        throw new BatchUndone(error);
      }
      if (outcome.commitError) throw outcome.commitError;
      log.push('commit');
      return results;
    },
  };
}

/** A statement named `name` that answers where it ran, or fails on `failOn`. */
const statement = (log: string[], name: string, failOn?: string) => async (q: string) => {
  log.push(`${name}@${q}`);
  if (q === failOn) throw new Error(`${name} failed`);
  return `${name}:${q}`;
};

/**
 * A gate of one place per account, its place taken by a statement that ends when `release` is awaited: what is
 * asked for meanwhile waits, and goes when `release` frees the place.
 */
function occupiedGate(outcome: { commitError?: Error } = {}, batchMax?: number) {
  const log: string[] = [];
  const gate = createAccountGate(1, recordingRunner(log, outcome), batchMax);
  let finish!: () => void;
  const first = gate('acct', () => new Promise<void>((resolve) => (finish = resolve)), true);
  const release = async () => {
    finish();
    await first;
  };
  return { log, gate, release };
}

test('behavior: the batchable statements waiting when a place frees go together, in arrival order, up to the batch size; a lone one runs alone', async () => {
  const { log, gate, release } = occupiedGate({}, 3);
  const waiting = ['a', 'b', 'c', 'd'].map((name) => gate('acct', statement(log, name), true));
  expect(log).toEqual([]);
  await release();
  expect(await Promise.all(waiting)).toEqual(['a:trx', 'b:trx', 'c:trx', 'd:db']);
  // a, b and c waited together (the batch size is 3); d was then alone.
  expect(log).toEqual(['begin 3', 'a@trx', 'b@trx', 'c@trx', 'commit', 'd@db']);
});

test('behavior: a statement that is not batchable runs alone in its turn and ends the batch before it', async () => {
  const { log, gate, release } = occupiedGate();
  const results = [
    gate('acct', statement(log, 'a'), true),
    gate('acct', statement(log, 'b'), true),
    gate('acct', statement(log, 'script'), false),
    gate('acct', statement(log, 'c'), true),
  ];
  await release();
  expect(await Promise.all(results)).toEqual(['a:trx', 'b:trx', 'script:db', 'c:db']);
  expect(log).toEqual(['begin 2', 'a@trx', 'b@trx', 'commit', 'script@db', 'c@db']);
});

test('fault: a statement failing in a batch undoes it; each statement then runs alone, and each caller gets its own answer', async () => {
  const { log, gate, release } = occupiedGate();
  const results = [
    gate('acct', statement(log, 'a'), true),
    // Fails in the batch only: alone it answers.
    gate('acct', statement(log, 'b', 'trx'), true),
    // Fails wherever it runs.
    gate(
      'acct',
      async (q: string) => {
        log.push(`c@${q}`);
        throw new Error('c refused');
      },
      true,
    ),
  ].map((p) => p.then(String, (error: Error) => `error: ${error.message}`));
  await release();
  expect(await Promise.all(results)).toEqual(['a:db', 'b:db', 'error: c refused']);
  expect(log).toEqual(['begin 3', 'a@trx', 'b@trx', 'rollback', 'a@db', 'b@db', 'c@db']);
});

test('fault: a commit that fails fails every statement of the batch with its error, none run again', async () => {
  const lost = new Error('connection lost during COMMIT');
  const { log, gate, release } = occupiedGate({ commitError: lost });
  const results = ['a', 'b'].map((name) =>
    gate('acct', statement(log, name), true).then(String, (error: Error) => error),
  );
  await release();
  expect(await Promise.all(results)).toEqual([lost, lost]);
  expect(log).toEqual(['begin 2', 'a@trx', 'b@trx']);
  // The lane is free again.
  expect(await gate('acct', statement(log, 'after'), true)).toBe('after:db');
});
