/**
 * `WORKERS=3`: `server/main.ts` becomes a node:cluster primary with three worker processes answering on one
 * port and sharing one PostgreSQL database. The primary bootstraps once (one generated ADMIN key), every
 * worker serves (told apart by the pid on each request's log line, matched by CF-RAY), a worker killed with
 * SIGKILL is replaced while the others keep answering, and SIGTERM drains all of them.
 */
import { afterAll, describe, expect, test } from 'vitest';
import { createApiKeys } from '../../server/storage/api-keys.ts';
import { createDatabase } from '../../server/storage/database.ts';
import { checkInvariants } from '../support/invariants.ts';
import { postgresPerFile } from '../support/postgres-per-file.ts';
import { isAlive, waitForExit } from '../support/process.ts';
import { type ServerProcess, startServerProcess, stopServerProcesses } from '../support/server-process.ts';

const postgres = postgresPerFile();

afterAll(async () => {
  await stopServerProcesses();
});

/** Which worker answered each request: the pid of the log line carrying the response's CF-RAY. */
async function answeredBy(server: ServerProcess, rays: string[]): Promise<number[]> {
  await server.waitForLog((lines) => {
    const seen = new Set(lines.filter((l) => l.msg === 'request').map((l) => l.cfRay));
    return rays.every((ray) => seen.has(ray));
  }, 10_000);
  const pidOf = new Map(
    server
      .logs()
      .filter((l) => l.msg === 'request')
      .map((l) => [l.cfRay, l.pid as number]),
  );
  return rays.map((ray) => pidOf.get(ray) ?? -1);
}

async function balanceCalls(server: ServerProcess, key: string, count: number) {
  const results = await Promise.all(
    Array.from({ length: count }, () =>
      fetch(`${server.base}/billing/balance`, { headers: { authorization: `Bearer ${key}` } }).then(
        async (r) => ({ status: r.status, ray: r.headers.get('cf-ray') ?? '', body: await r.text() }),
      ),
    ),
  );
  return results;
}

describe('WORKERS=3: one port, three worker processes, one database', () => {
  test('behavior: the primary bootstraps once; all three workers answer; a killed worker is replaced; SIGTERM drains all', {
    timeout: 240_000,
  }, async () => {
    const url = await postgres().createDatabase('cluster');
    const server = await startServerProcess(
      { DATABASE_URL: url, WORKERS: '3', BOOTSTRAP_BALANCE_USD: '5' },
      { listening: 3 },
    );
    // One generated key, printed once by the primary; the workers found the database bootstrapped.
    const printed = [...server.output().matchAll(/ADMIN_API_KEY=(svc_admin_\w+)/g)].map((m) => m[1]);
    expect(printed).toHaveLength(1);
    const key = printed[0] ?? '';
    const database = await createDatabase(url);
    try {
      expect(
        await createApiKeys(database).list(
          (await database.db.selectFrom('accounts').select('id').executeTakeFirstOrThrow()).id,
        ),
      ).toHaveLength(1);
    } finally {
      await database.close();
    }

    const workers = server.workerPids();
    expect(workers).toHaveLength(3);
    const listening = server.logs().filter((l) => l.msg === 'listening');
    expect(new Set(listening.map((l) => l.url)).size).toBe(1);
    expect(new Set(listening.map((l) => l.pid))).toEqual(new Set(workers));

    const first = await balanceCalls(server, key, 30);
    expect(first.map((r) => r.status)).toEqual(Array(30).fill(200));
    for (const r of first) expect(JSON.parse(r.body)).toMatchObject({ balances: { usd: 5 } });
    const pids = await answeredBy(
      server,
      first.map((r) => r.ray),
    );
    expect(new Set(pids)).toEqual(new Set(workers));

    // A key created through one worker authenticates on every worker.
    const created = await fetch(`${server.base}/api_keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ apiKeyType: 'ADMIN', description: 'cluster' }),
    });
    expect(created.status).toBe(200);
    const another = ((await created.json()) as { data: { apiKey: string } }).data.apiKey;
    const withNew = await balanceCalls(server, another, 15);
    expect(withNew.map((r) => r.status)).toEqual(Array(15).fill(200));
    expect(
      new Set(
        await answeredBy(
          server,
          withNew.map((r) => r.ray),
        ),
      ).size,
    ).toBe(3);

    // SIGKILL one worker: the primary replaces it and the port keeps answering.
    const victim = workers[0] ?? 0;
    process.kill(victim, 'SIGKILL');
    await server.waitForLog((lines) =>
      lines.some((l) => String(l.msg).startsWith('worker died') && l.worker === victim),
    );
    await server.waitForLog((lines) => lines.filter((l) => l.msg === 'listening').length >= 4);
    const replacement = server.workerPids().filter((pid) => !workers.includes(pid));
    expect(replacement).toHaveLength(1);
    const after = await balanceCalls(server, key, 30);
    expect(after.map((r) => r.status)).toEqual(Array(30).fill(200));
    const afterPids = new Set(
      await answeredBy(
        server,
        after.map((r) => r.ray),
      ),
    );
    expect(afterPids.has(victim)).toBe(false);
    expect(afterPids).toEqual(new Set([...workers.slice(1), ...replacement]));

    // SIGTERM drains every worker, then the primary exits 0.
    process.kill(server.pid, 'SIGTERM');
    expect(await server.exited).toBe(0);
    for (const pid of server.workerPids()) {
      await waitForExit(pid, 5_000);
      expect(isAlive(pid)).toBe(false);
    }
    expect(server.logs().filter((l) => l.msg === 'stopped').length).toBe(4);
    expect((await checkInvariants(url)).violations).toEqual([]);
  });
});
