/**
 * The per-account gate of PostgreSQL's row-locking statements (server/storage/account-gate.ts): at most `limit`
 * of one account's run at once, the rest start in arrival order as places free up, a failure frees its place
 * too, and other accounts never wait.
 */
import { expect, test } from 'vitest';
import { createAccountGate } from '../../server/storage/account-gate.ts';

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
  const gate = createAccountGate(2);
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
  const gate = createAccountGate(1);
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
  for (const bad of [0, -1, 1.5, Number.NaN]) expect(() => createAccountGate(bad)).toThrow(RangeError);
});
