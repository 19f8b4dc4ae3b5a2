/**
 * The API-key cache: a lookup is reused without touching the database, a revocation or update through the
 * same process applies at once, one made by another process (a second repository on the same database, as
 * `npm run admin` or another instance would) applies once the bound `ttlMs` has passed, failures are never
 * cached, and last-used writes are throttled. Also over HTTP: a key revoked through the API is refused on
 * the very next request although its lookup was cached.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, test } from 'vitest';
import { cacheApiKeys } from '../../server/domains/keys/cache.ts';
import { createAccounts, createApiKeys, createDatabase, type Database } from '../../server/storage/index.ts';
import { migrate } from '../../server/storage/migrations.ts';
import { type ChatServer, startChatServer } from '../support/chat-server.ts';

const scratch = mkdtempSync(join(tmpdir(), 'key-cache-'));
const url = `sqlite:${join(scratch, 'db.sqlite')}`;
let statements: string[] = [];
let here: Database; // this process's connection, counted
let elsewhere: Database; // another process's connection

beforeAll(async () => {
  here = await createDatabase(url, { onQuery: (sql) => statements.push(sql) });
  await migrate(here);
  elsewhere = await createDatabase(url);
});

afterAll(async () => {
  await here?.close();
  await elsewhere?.close();
  rmSync(scratch, { recursive: true, force: true });
});

async function setup(ttlMs: number) {
  let clock = 1_000_000;
  const now = () => clock;
  const account = await createAccounts(here).createApiAccount({});
  const cached = cacheApiKeys(createApiKeys(here, { now }), { ttlMs, now });
  const other = createApiKeys(elsewhere, { now });
  const { key, secret } = await other.create({ accountId: account.id, keyType: 'INFERENCE' });
  return { cached, other, key, secret, advance: (ms: number) => (clock += ms) };
}

describe('cacheApiKeys', () => {
  test('a second lookup within the bound sends no statement', async () => {
    const { cached, secret, key } = await setup(1000);
    expect(await cached.authenticate(secret)).toMatchObject({ ok: true, key: { id: key.id } });
    statements = [];
    expect(await cached.authenticate(secret)).toMatchObject({ ok: true, key: { id: key.id } });
    expect(statements).toEqual([]);
  });

  test('revoked through this process: refused on the next lookup', async () => {
    const { cached, secret, key } = await setup(60_000);
    expect((await cached.authenticate(secret)).ok).toBe(true);
    await cached.revoke(key.id);
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'revoked' });
  });

  test('updated through this process: the next lookup sees the new settings', async () => {
    const { cached, secret, key } = await setup(60_000);
    await cached.authenticate(secret);
    await cached.update(key.id, { description: 'renamed' });
    expect(await cached.authenticate(secret)).toMatchObject({ ok: true, key: { description: 'renamed' } });
  });

  test('revoked by another process: refused once the bound has passed, not before', async () => {
    const { cached, other, secret, key, advance } = await setup(1000);
    expect((await cached.authenticate(secret)).ok).toBe(true);
    await other.revoke(key.id);
    advance(999);
    expect((await cached.authenticate(secret)).ok).toBe(true);
    advance(1);
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'revoked' });
  });

  test('with ttlMs 0 every lookup reads the database', async () => {
    const { cached, other, secret, key } = await setup(0);
    expect((await cached.authenticate(secret)).ok).toBe(true);
    await other.revoke(key.id);
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'revoked' });
  });

  test('an expiry passing while cached is honoured', async () => {
    const { cached, other, secret, key, advance } = await setup(60_000);
    await other.update(key.id, { expiresAtMs: 1_000_500 });
    expect((await cached.authenticate(secret)).ok).toBe(true);
    advance(500);
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'expired' });
  });

  test('unknown secrets are not cached: a refusal is always a database lookup', async () => {
    const { cached } = await setup(60_000);
    const secret = 'svc_inference_not_a_real_key_0000000000000000000000';
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'unknown' });
    statements = [];
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'unknown' });
    expect(statements.length).toBe(1);
  });

  test('last-used writes: at most one per key per second from one process', async () => {
    const { cached, key, advance } = await setup(60_000);
    statements = [];
    await cached.touchLastUsed(key.id);
    advance(500);
    await cached.touchLastUsed(key.id);
    expect(statements.length).toBe(1);
    advance(500);
    await cached.touchLastUsed(key.id);
    expect(statements.length).toBe(2);
  });

  test('authenticateCached: the cached answer itself (no promise, no statement), undefined to look up', async () => {
    const { cached, other, secret, key, advance } = await setup(1000);
    // Not looked up yet: nothing to answer at once.
    expect(cached.authenticateCached(secret)).toBeUndefined();
    await cached.authenticate(secret);
    statements = [];
    expect(cached.authenticateCached(secret)).toMatchObject({ ok: true, key: { id: key.id } });
    expect(statements).toEqual([]);
    // Past the bound: looked up again (and refused, revoked elsewhere meanwhile).
    await other.revoke(key.id);
    advance(1000);
    expect(cached.authenticateCached(secret)).toBeUndefined();
    expect(await cached.authenticate(secret)).toEqual({ ok: false, reason: 'revoked' });
    expect(cached.authenticateCached(secret)).toBeUndefined();
    expect(cached.authenticateCached('svc_inference_not_a_real_key_0000000000000000000000')).toBeUndefined();
  });

  test('authenticateCached: a cached key whose expiry has passed is refused at once, and forgotten', async () => {
    const { cached, other, secret, key, advance } = await setup(60_000);
    await other.update(key.id, { expiresAtMs: 1_000_500 });
    await cached.authenticate(secret);
    advance(500);
    expect(cached.authenticateCached(secret)).toEqual({ ok: false, reason: 'expired' });
    expect(cached.authenticateCached(secret)).toBeUndefined();
  });

  test('touchIfDue: the write when due, undefined (nothing to wait for) within the second', async () => {
    const { cached, key, advance } = await setup(60_000);
    statements = [];
    const first = cached.touchIfDue(key.id);
    expect(first).toBeInstanceOf(Promise);
    await first;
    advance(999);
    expect(cached.touchIfDue(key.id)).toBeUndefined();
    expect(statements.length).toBe(1);
    advance(1);
    await cached.touchIfDue(key.id);
    expect(statements.length).toBe(2);
  });
});

describe('over HTTP', () => {
  let server: ChatServer;
  beforeAll(async () => {
    server = await startChatServer({ env: { API_KEY_CACHE_TTL_MS: '60000' } });
  });
  afterAll(async () => {
    await server?.close();
  });

  test('a key revoked through DELETE /api_keys is refused on the next request', async () => {
    const { accountId, key } = await server.account('1');
    const admin = await server.services.keys.create({ accountId, keyType: 'ADMIN' });
    const me = (secret: string) =>
      fetch(`${server.base}/api_keys/rate_limits`, { headers: { authorization: `Bearer ${secret}` } });
    expect((await me(key)).status).toBe(200);
    const [record] = (await server.services.keys.list(accountId)).filter((k) => k.keyType === 'INFERENCE');
    const revoked = await fetch(`${server.base}/api_keys?id=${record?.id}`, {
      method: 'DELETE',
      headers: { authorization: `Bearer ${admin.secret}` },
    });
    expect(revoked.status).toBe(200);
    expect((await me(key)).status).toBe(401);
  });
});
