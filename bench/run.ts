/**
 * `npm run bench`: the performance harness. Starts, on loopback only, a bare `node:http` JSON server (the
 * ceiling), this server on SQLite (its chat paid by API key; and, in a process and file of their own, by
 * wallets, each request of a wallet with a Sign-In-With-X header of its own, signed before the target's turn)
 * and on PostgreSQL (separate processes, production settings), the Prism mock, anvil, a minimal OpenAI-compatible upstream and a streaming
 * instance; then measures them interleaved
 * (round 1: A B C …, round 2: A B C …; within a round, the one-at-a-time targets of a proxy path in turns of
 * BENCH_LATENCY_TURN requests) so that a noisy machine affects every target alike, and reports the medians
 * and the ratios against the targets of the performance issue. Writes bench/results/latest.json and
 * latest.md. Every process it starts is stopped by its pid, also when a step fails or on Ctrl-C.
 *
 * Knobs: `--quick` (or BENCH_QUICK=1): 2 rounds of 2 s, 500 streams; BENCH_DURATION (seconds per
 * throughput run, default 4), BENCH_ROUNDS (default 3), BENCH_CONNECTIONS (default 16), BENCH_STREAMS
 * (default 1000), BENCH_LATENCY_COUNT (sequential requests per latency run, default 2000: a p99 from 20
 * samples above it, not 4), BENCH_LATENCY_TURN (requests per turn of the one-at-a-time targets, default 100).
 * `--only streams` (or BENCH_ONLY=streams): only the streams part (the streaming server and its RSS, no
 * PostgreSQL, anvil, Prism or throughput rounds), for iterating on memory; the other rows are left empty and
 * the report goes to bench/results/streams.json and streams.md instead.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { startPrism } from '../mocks/prism.ts';
import { startAnvil } from '../test/support/anvil.ts';
import { repoRoot } from '../test/support/contract.ts';
import { startPostgres } from '../test/support/postgres.ts';
import {
  type CpuPerRequest,
  countedLatencies,
  cpuPerRequest,
  cpuReading,
  processTree,
  systemCallUs,
  type ThreadCounters,
} from './counters.ts';
import {
  headersPerConnection,
  type Latency,
  median,
  probe,
  type Streams,
  streams,
  type Target,
  type Throughput,
  throughput,
  warmUp,
} from './measure.ts';
import { type Child, cleanUpOnInterrupt, rssOf, startNodeChild, stopAll, track } from './processes.ts';
import { type Report, renderMarkdown, renderTable } from './report.ts';
import {
  adapterTarget,
  catalogOverride,
  chatBody,
  envInt,
  fundedKey,
  fundedKeys,
  json,
  keyPerConnectionChatTarget,
  localChatTarget,
  nodeTarget,
  RPC_BODY,
  rpcTarget,
  serverEnv,
  upstreamTarget,
} from './setup.ts';
import { fundedWallets, walletChatTarget, walletEnv } from './wallets.ts';

const quick = process.argv.includes('--quick') || process.env.BENCH_QUICK === '1';
const onlyArg = process.argv.indexOf('--only');
const only = (onlyArg >= 0 ? process.argv[onlyArg + 1] : process.env.BENCH_ONLY) || undefined;
if (only !== undefined && only !== 'streams') {
  process.stderr.write(`[bench] unknown --only/BENCH_ONLY value: ${only} (known: streams)\n`);
  process.exit(2);
}
const settings = {
  quick,
  onlyStreams: only === 'streams',
  durationS: envInt('BENCH_DURATION', quick ? 2 : 4),
  warmupS: envInt('BENCH_WARMUP', quick ? 1 : 2),
  rounds: envInt('BENCH_ROUNDS', quick ? 2 : 3),
  connections: envInt('BENCH_CONNECTIONS', 16),
  streams: envInt('BENCH_STREAMS', quick ? 500 : 1000),
  latencyCount: envInt('BENCH_LATENCY_COUNT', quick ? 1000 : 2000),
  latencyTurn: envInt('BENCH_LATENCY_TURN', 100),
};

/**
 * Streams: 10 tokens a second each (a slow reader's pace), 150 tokens, so that every stream stays open for
 * 15 s while the others are opened; what is measured is how many one process holds at once.
 */
const STREAM_TOKEN_DELAY_MS = 100;
const STREAM_TOKENS = 150;

/** The server as `npm start` runs it. */
const SERVER = 'server/start.mjs';

const log = (message: string) => process.stderr.write(`[bench] ${message}\n`);
const scratch = mkdtempSync(join(tmpdir(), 'svc-bench-'));

async function main(): Promise<Report> {
  log(`settings: ${JSON.stringify(settings)}`);
  const upstream = await startNodeChild('upstream', 'bench/upstream.ts', {}, '/');
  const catalogPath = join(scratch, 'catalog.yaml');
  writeFileSync(catalogPath, catalogOverride(upstream.origin));
  const streamsUrl = `sqlite:${join(scratch, 'streams.db')}`;
  if (settings.onlyStreams) {
    const key = await fundedKey(streamsUrl);
    return {
      ...header(),
      rows: [],
      sequential: {},
      streams: await measureStreams(catalogPath, streamsUrl, key),
    };
  }

  log('starting PostgreSQL, anvil and the Prism mock');
  const [postgres, anvil, prism] = await Promise.all([
    startPostgres(),
    startAnvil(),
    startPrism({ mode: 'mock', specPath: join(repoRoot, 'generated', 'openapi.yaml'), host: '127.0.0.1' }),
  ]);
  track(-1, () => postgres.stop());
  track(anvil.pid, () => anvil.stop());
  track(prism.pid, () => prism.stop());

  const sqliteUrl = `sqlite:${join(scratch, 'bench.db')}`;
  const postgresUrl = await postgres.createDatabase('bench');
  const floorFile = join(scratch, 'floor.db');
  const bareFile = join(scratch, 'bare.db');
  const aheadUrl = `sqlite:${join(scratch, 'ahead.db')}`;
  const infoUrl = `sqlite:${join(scratch, 'info.db')}`;
  const walletsUrl = `sqlite:${join(scratch, 'wallets.db')}`;
  const workersUrl = `sqlite:${join(scratch, 'workers.db')}`;
  const [sqliteKey, budgetKey, postgresKey, streamsKey, floorKey, bareKey, aheadKey, infoKey, workersKey] = [
    await fundedKey(sqliteUrl),
    // A spend limit of a million USD a day: checked on every request, never reached.
    await fundedKey(sqliteUrl, 10n ** 15n),
    await fundedKey(postgresUrl),
    await fundedKey(streamsUrl),
    await fundedKey(`sqlite:${floorFile}`),
    await fundedKey(`sqlite:${bareFile}`),
    await fundedKey(aheadUrl),
    await fundedKey(infoUrl),
    await fundedKey(workersUrl),
  ];
  // The PostgreSQL chat again with a key (and an account) per connection: what the one key's account lock
  // leaves out (every reservation and capture of an account waits for the one before it to commit).
  const postgresKeys = await fundedKeys(postgresUrl, settings.connections);
  // The wallet-paid chats: a wallet per connection for each kind (a wallet may have at most 5 paid requests in
  // flight; one connection never has more than one), each funded as the keys are, on a server of their own.
  const [evmWallets, solanaWallets] = [
    await fundedWallets(walletsUrl, 'evm', settings.connections),
    await fundedWallets(walletsUrl, 'solana', settings.connections),
  ];

  log('starting the ceiling and the servers');
  const rpcEnv = { RPC_UPSTREAM_BASE_MAINNET: anvil.url };
  const ceiling = await startNodeChild('ceiling', 'bench/ceiling.ts', {});
  const floorEnv = (file: string, key: string) => ({
    FLOOR_DB: file,
    FLOOR_KEY: key,
    FLOOR_UPSTREAM: anvil.url,
    FLOOR_CHAT_UPSTREAM: upstream.origin,
  });
  const floor = await startNodeChild('floor', 'bench/floor.ts', floorEnv(floorFile, floorKey));
  // The bare forward from a floor process of its own (it writes nothing): the JSON-RPC floor's process then
  // serves only that floor in its group's turns, so its system calls can be counted as the server's are.
  const bare = await startNodeChild('bare forward', 'bench/floor.ts', floorEnv(bareFile, bareKey));
  const onSqlite = await startNodeChild(
    'server (SQLite)',
    SERVER,
    serverEnv(sqliteUrl, catalogPath, rpcEnv),
    '/healthz',
  );
  // The wallet-paid chats' server, with a public origin for their sign-ins (walletEnv): a process and file of
  // their own, so that their tens of thousands of nonces, slots and entries per run do not deepen the B-trees
  // the SQLite server's other rows write (the adapter's write system calls per request read 42.0 instead of
  // about 40 when they shared it, twenty-fourth round).
  const onWallets = await startNodeChild(
    'server (SQLite, wallets)',
    SERVER,
    serverEnv(walletsUrl, catalogPath, walletEnv),
    '/healthz',
  );
  const onPostgres = await startNodeChild(
    'server (PostgreSQL)',
    SERVER,
    serverEnv(postgresUrl, catalogPath, rpcEnv),
    '/healthz',
  );
  // The same on SQLite with the chat's upstream calls sent before their holds are made (an option, off by
  // default: CHAT_CALL_BEFORE_HOLD); measured one request at a time beside the default.
  const ahead = await startNodeChild(
    'server (SQLite, CHAT_CALL_BEFORE_HOLD)',
    SERVER,
    serverEnv(aheadUrl, catalogPath, { CHAT_CALL_BEFORE_HOLD: 'true' }),
    '/healthz',
  );
  // The same on SQLite at the log level operators get by default (`info`: a line per request), its standard
  // output to a file as `npm start > server.log` sends it; the others run at `warn`, as they did from the
  // first round. Measured under load and one request at a time beside them.
  const atInfo = await startNodeChild(
    'server (SQLite, LOG_LEVEL=info)',
    SERVER,
    serverEnv(infoUrl, catalogPath, { ...rpcEnv, LOG_LEVEL: 'info' }),
    '/healthz',
    [],
    { stdoutFile: join(scratch, 'info.log') },
  );

  // Two worker processes (`WORKERS=2`) on a SQLite file of their own: what one machine's second CPU adds on
  // SQLite, whose workers share the file's write lock.
  const onWorkers = await startNodeChild(
    'server (SQLite, WORKERS=2)',
    SERVER,
    serverEnv(workersUrl, catalogPath, { WORKERS: '2' }),
    '/healthz',
  );

  const api = (server: Child) => `${server.origin}/api/v1`;
  // The chat upstream adapter's request to the upstream itself.
  const upstreamItself = upstreamTarget(upstream.origin);
  // `boundedBy`: for a target that signs a header for every request (`Target.signed`), the target measured
  // before it in each round whose requests per second bound its own, from which its pool of headers signed
  // before its turn is sized (`headersPerConnection`).
  const throughputTargets: Array<{
    id: string;
    label: string;
    target: Target;
    child: Child | number;
    boundedBy?: string;
    /** A `WORKERS` server: its workers, whose CPU and memory are read with the primary's (counters.ts). */
    workers?: number;
  }> = [
    {
      id: 'ceiling',
      label: 'bare node:http JSON handler (ceiling)',
      target: { url: `${ceiling.origin}/`, method: 'GET' },
      child: ceiling,
    },
    {
      id: 'floorChat',
      label: "storage floor: node:http + a chat's ledger writes, raw SQLite",
      target: {
        url: `${floor.origin}/chat`,
        method: 'POST',
        headers: json(),
        body: chatBody('llama-3.3-70b', false, 16),
      },
      child: floor,
    },
    {
      id: 'models',
      label: 'GET /models',
      target: { url: `${api(onSqlite)}/models`, method: 'GET' },
      child: onSqlite,
    },
    {
      id: 'chatSqlite',
      label: 'chat, local engine, API key, SQLite (full path)',
      target: localChatTarget(onSqlite.origin, sqliteKey),
      child: onSqlite,
    },
    {
      id: 'chatBudget',
      label: 'chat, local engine, API key with a daily spend limit, SQLite',
      target: localChatTarget(onSqlite.origin, budgetKey),
      child: onSqlite,
    },
    {
      id: 'chatInfo',
      label: 'chat, local engine, API key, SQLite, LOG_LEVEL=info (the default)',
      target: localChatTarget(atInfo.origin, infoKey),
      child: atInfo,
    },
    {
      // Two worker processes on one SQLite file, which wait for its write lock on their event loops
      // (database.ts `sharedWriters`; bench/HISTORY.md, fortieth round).
      id: 'chatWorkers',
      label: 'chat, local engine, API key, SQLite, WORKERS=2',
      target: localChatTarget(onWorkers.origin, workersKey),
      child: onWorkers,
      workers: 2,
    },
    {
      id: 'chatPostgres',
      label: 'chat, local engine, API key, PostgreSQL (full path)',
      target: localChatTarget(onPostgres.origin, postgresKey),
      child: onPostgres,
    },
    {
      id: 'chatPostgresKeys',
      label: 'chat, local engine, a key per connection, PostgreSQL',
      target: keyPerConnectionChatTarget(onPostgres.origin, postgresKeys),
      child: onPostgres,
    },
    {
      // The SQLite chat paid by a wallet: its sign-in checked and its nonce recorded on every request, its
      // requests in flight counted, instead of the key. Bounded by the key's chat: the same work and more.
      id: 'chatWallet',
      label: 'chat, local engine, wallet (EVM sign-in), SQLite',
      target: walletChatTarget(onWallets.origin, evmWallets),
      child: onWallets,
      boundedBy: 'chatSqlite',
    },
    {
      id: 'chatWalletSolana',
      label: 'chat, local engine, wallet (Solana sign-in), SQLite',
      target: walletChatTarget(onWallets.origin, solanaWallets),
      child: onWallets,
      boundedBy: 'chatSqlite',
    },
    {
      id: 'chatPrism',
      label: 'chat on the Prism mock (no auth, no billing)',
      target: {
        url: `${prism.url}/chat/completions`,
        method: 'POST',
        headers: json('mock-key'),
        body: chatBody('llama-3.3-70b', false, 16),
      },
      child: prism.pid,
    },
    {
      id: 'rpcProxy',
      label: 'RPC proxy -> anvil (eth_blockNumber)',
      target: rpcTarget(onSqlite.origin, sqliteKey),
      child: onSqlite,
    },
    {
      id: 'rpcInfo',
      label: 'RPC proxy -> anvil, LOG_LEVEL=info (the default)',
      target: rpcTarget(atInfo.origin, infoKey),
      child: atInfo,
    },
    {
      id: 'rpcPostgres',
      label: 'RPC proxy -> anvil, PostgreSQL',
      target: rpcTarget(onPostgres.origin, postgresKey),
      child: onPostgres,
    },
    {
      id: 'rpcDirect',
      label: 'anvil directly (eth_blockNumber)',
      target: nodeTarget(anvil.url),
      child: anvil.pid,
    },
    {
      id: 'upstreamProxy',
      label: 'chat upstream adapter -> local upstream (streamed)',
      target: adapterTarget(onSqlite.origin, sqliteKey),
      child: onSqlite,
    },
    {
      // Under load too, so that it is as warm as the default when it is measured one request at a time.
      id: 'upstreamAhead',
      label: 'the same with CHAT_CALL_BEFORE_HOLD=true (off by default)',
      target: adapterTarget(ahead.origin, aheadKey),
      child: ahead,
    },
    {
      id: 'upstreamInfo',
      label: 'chat upstream adapter, LOG_LEVEL=info (the default)',
      target: adapterTarget(atInfo.origin, infoKey),
      child: atInfo,
    },
    {
      id: 'upstreamDirect',
      label: 'local upstream directly (streamed)',
      target: upstreamItself,
      child: upstream,
    },
  ];

  // One request at a time: the proxies and their upstreams, and the floors of a proxy on this machine (the
  // forward alone, the forward with an RPC call's ledger writes around it, and a streamed chat's through the
  // chat upstream with a chat's).
  const latencyOnly: Array<{ id: string; target: Target }> = [
    {
      // The upstream directly again, in turns with the adapter of CHAT_CALL_BEFORE_HOLD.
      id: 'upstreamDirectAhead',
      target: upstreamItself,
    },
    // anvil and the upstream directly again, in turns with the server at LOG_LEVEL=info.
    { id: 'rpcDirectInfo', target: nodeTarget(anvil.url) },
    { id: 'upstreamDirectInfo', target: upstreamItself },
    {
      id: 'floorRpc',
      target: { url: `${floor.origin}/rpc`, method: 'POST', headers: json(), body: RPC_BODY },
    },
    {
      id: 'floorUpstream',
      target: {
        url: `${floor.origin}/upstream`,
        method: 'POST',
        headers: json(),
        body: chatBody('bench-upstream', true, 16),
      },
    },
    {
      id: 'bareProxy',
      target: { url: `${bare.origin}/proxy`, method: 'POST', headers: json(), body: RPC_BODY },
    },
  ];
  const everyTarget = [...throughputTargets, ...latencyOnly];
  // The targets whose answer must come from the chat upstream (the adapter on each server, and its floor).
  const reachesChatUpstream = new Set(['upstreamProxy', 'upstreamAhead', 'upstreamInfo', 'floorUpstream']);
  log('checking every target once');
  for (const { id, target } of everyTarget) {
    const body = await probe(target).catch((error: unknown) => {
      throw new Error(`${id}: ${(error as Error).message}`);
    });
    if (reachesChatUpstream.has(id) && !body.includes('"content":" bench"')) {
      throw new Error(`${id} did not reach the upstream: ${body.slice(0, 200)}`);
    }
    if ((id === 'floorRpc' || id === 'bareProxy') && !body.includes('"result"')) {
      throw new Error(`${id} did not reach anvil: ${body.slice(0, 200)}`);
    }
  }

  // Each throughput target under load once before the rounds, not recorded (measure.ts, `warmUp`): two workers
  // (each its own V8) take twice as many requests to compile their hot code. Without it the first round of the
  // `WORKERS=2` row read 3,409 chats/s and 163 µs of other threads a chat, its second 6,062, its third 7,494
  // (bench/HISTORY.md, fortieth round).
  if (settings.warmupS > 0) log(`warming every throughput target up (${settings.warmupS} s each)`);
  await warmUp(
    throughputTargets.map(({ target }) => target),
    settings.warmupS,
    settings.connections,
  );

  const runs = new Map<string, Throughput[]>(throughputTargets.map((t) => [t.id, []]));
  // What each target's server process and the client (this process: autocannon) spent per request meanwhile.
  const cpuRuns = new Map<string, CpuPerRequest[]>(throughputTargets.map((t) => [t.id, []]));
  const pidOf = (child: Child | number) => (typeof child === 'number' ? child : child.pid);
  // The one-at-a-time targets in two groups, each measured in turns (measure.ts, `latencies`): the JSON-RPC
  // proxy, its floors and anvil directly; the chat upstream adapter, its floor and the upstream directly.
  const latencyGroups = [
    ['rpcProxy', 'floorRpc', 'bareProxy', 'rpcDirect'],
    ['upstreamProxy', 'floorUpstream', 'upstreamDirect'],
    // In a group of its own, first in its turns as the default is in its own: the target that follows another
    // server's turn reads 0.05 to 0.1 ms slower (nineteenth round, the order swapped).
    ['upstreamAhead', 'upstreamDirectAhead'],
    // The server at LOG_LEVEL=info, in groups of its own for the same reason.
    ['rpcInfo', 'rpcDirectInfo'],
    ['upstreamInfo', 'upstreamDirectInfo'],
  ].map((ids) =>
    ids.map((id) => {
      const target = everyTarget.find((t) => t.id === id)?.target;
      if (!target) throw new Error(`no target ${id}`);
      return { id, target };
    }),
  );
  const sequentialRuns = new Map<string, Latency[]>(latencyGroups.flat().map(({ id }) => [id, []]));
  // The targets whose process serves nothing else in their group's turns: what its main thread counts while
  // the group runs is theirs (the bare forward has a process of its own for this).
  const countedBy = new Map<string, number>([
    ['rpcProxy', onSqlite.pid],
    ['floorRpc', floor.pid],
    ['upstreamProxy', onSqlite.pid],
    ['floorUpstream', floor.pid],
    ['upstreamAhead', ahead.pid],
    ['rpcInfo', atInfo.pid],
    ['upstreamInfo', atInfo.pid],
  ]);
  const countedRuns = new Map<string, ThreadCounters[]>([...countedBy.keys()].map((id) => [id, []]));
  for (let round = 1; round <= settings.rounds; round++) {
    const thisRound = new Map<string, number>();
    for (const { id, target, boundedBy, child, workers } of throughputTargets) {
      const presign = target.signed
        ? headersPerConnection(
            thisRound.get(boundedBy ?? '') ?? Number.NaN,
            settings.durationS,
            settings.connections,
          )
        : 0;
      const pid = pidOf(child);
      const tree = workers !== undefined;
      const before = cpuReading(pid, tree);
      const clientBefore = process.cpuUsage();
      const result = await throughput(target, settings.durationS, settings.connections, { presign });
      const client = process.cpuUsage(clientBefore);
      const cpu = cpuPerRequest(
        before,
        cpuReading(pid, tree),
        client.user + client.system,
        result.rps * settings.durationS,
        workers,
      );
      runs.get(id)?.push(result);
      cpuRuns.get(id)?.push(cpu);
      thisRound.set(id, result.rps);
      log(
        `round ${round} ${id}: ${result.rps.toFixed(0)} req/s, p50 ${result.p50Ms} ms, p99 ${result.p99Ms} ms` +
          (result.failures ? `, ${result.failures} failures` : '') +
          (result.signed
            ? `; sign-ins signed before the run ${result.signed.before}, during it ${result.signed.during}`
            : '') +
          `; CPU per request: server main thread ${cpu.mainUs.toFixed(1)} µs, other threads ${cpu.othersUs.toFixed(1)} µs, client ${cpu.clientUs.toFixed(1)} µs; machine idle ${cpu.idlePercent.toFixed(0)}%, wake-up IPIs ${(cpu.wakeups ?? Number.NaN).toFixed(2)}`,
      );
    }
    for (const group of latencyGroups) {
      const counted = group.filter(({ id }) => countedBy.has(id));
      const { measured: results, counted: counts } = await countedLatencies(
        group.map(({ target }) => target),
        settings.latencyCount,
        { block: settings.latencyTurn },
        counted.map(({ id }) => countedBy.get(id) as number),
      );
      for (const [i, { id }] of counted.entries()) countedRuns.get(id)?.push(counts[i] as ThreadCounters);
      for (const [i, { id }] of group.entries()) {
        const result = results[i];
        if (!result) continue;
        sequentialRuns.get(id)?.push(result);
        log(
          `round ${round} ${id} sequential: p50 ${result.p50Us.toFixed(0)} µs, p99 ${result.p99Us.toFixed(0)} µs`,
        );
      }
    }
  }

  // A `WORKERS` server's peak: the primary's and its workers' peaks added up (each its own process's).
  const peakOf = (child: Child | number, workers?: number) =>
    workers !== undefined
      ? processTree(pidOf(child)).reduce((sum, pid) => sum + rssOf(pid).peak, 0)
      : typeof child === 'number'
        ? rssOf(child).peak
        : child.peakRss();
  const rows = throughputTargets.map(({ id, label, child, workers }) => {
    const results = runs.get(id) ?? [];
    const cpu = cpuRuns.get(id) ?? [];
    return {
      id,
      label,
      rps: median(results.map((r) => r.rps)),
      p50Ms: median(results.map((r) => r.p50Ms)),
      p99Ms: median(results.map((r) => r.p99Ms)),
      failures: results.reduce((sum, r) => sum + r.failures, 0),
      peakRssMb: peakOf(child, workers) / 2 ** 20,
      cpu: {
        mainUs: median(cpu.map((c) => c.mainUs)),
        othersUs: median(cpu.map((c) => c.othersUs)),
        clientUs: median(cpu.map((c) => c.clientUs)),
        idlePercent: median(cpu.map((c) => c.idlePercent)),
        wakeups: median(cpu.map((c) => c.wakeups ?? Number.NaN)),
        ...(workers === undefined ? {} : { mainThreads: workers }),
      },
    };
  });
  const sequential = Object.fromEntries(
    [...sequentialRuns.entries()].map(([id, results]) => {
      const counts = countedRuns.get(id);
      return [
        id,
        {
          p50Us: median(results.map((r) => r.p50Us)),
          p99Us: median(results.map((r) => r.p99Us)),
          ...(counts
            ? {
                readsPerRequest: median(counts.map((c) => c.reads)),
                writesPerRequest: median(counts.map((c) => c.writes)),
              }
            : {}),
        },
      ];
    }),
  );

  await Promise.all([onPostgres.stop(), ceiling.stop(), floor.stop(), bare.stop()]);
  return {
    ...header(),
    rows,
    sequential,
    streams: await measureStreams(catalogPath, streamsUrl, streamsKey),
  };
}

/** Streams: a separate server whose engine paces tokens, so that every stream stays open for seconds. */
async function measureStreams(
  catalogPath: string,
  streamsUrl: string,
  streamsKey: string,
): Promise<Report['streams']> {
  const streaming = await startNodeChild(
    'server (streams)',
    SERVER,
    serverEnv(streamsUrl, catalogPath, { LOCAL_CHAT_TOKEN_DELAY_MS: String(STREAM_TOKEN_DELAY_MS) }),
    '/healthz',
  );
  log(`opening ${settings.streams} concurrent streams`);
  const baseRss = streaming.rss();
  let peakDuringStreams = baseRss;
  const sampler = setInterval(() => {
    peakDuringStreams = Math.max(peakDuringStreams, streaming.rss());
  }, 100);
  let streamResult: Streams;
  let firstBurst: Streams;
  const streamTarget = (tokens: number): Target => ({
    url: `${streaming.origin}/api/v1/chat/completions`,
    method: 'POST',
    headers: json(streamsKey),
    body: chatBody('llama-3.3-70b', true, tokens, 'Write 500 words about the benchmark.'),
  });
  try {
    // The fresh process's first burst (short streams): a cold start's TTFB, and the code compiled for the next.
    firstBurst = await streams(streamTarget(2), settings.streams, 120_000);
    log(`streams, the first burst (cold): ${JSON.stringify(firstBurst)}`);
    streamResult = await streams(streamTarget(STREAM_TOKENS), settings.streams, 120_000);
  } finally {
    clearInterval(sampler);
  }
  const streamsPeakRss = Math.max(peakDuringStreams, streaming.peakRss());
  log(`streams: ${JSON.stringify(streamResult)}; peak RSS ${(streamsPeakRss / 2 ** 20).toFixed(0)} MB`);

  await streaming.stop();
  const { requested, completed, ttfbP50Ms, ttfbP99Ms, failures } = firstBurst;
  return {
    ...streamResult,
    peakRssMb: streamsPeakRss / 2 ** 20,
    idleRssMb: baseRss / 2 ** 20,
    firstBurst: { requested, completed, ttfbP50Ms, ttfbP99Ms, failures },
  };
}

function header(): Pick<Report, 'when' | 'machine' | 'settings'> {
  return {
    when: new Date().toISOString(),
    machine: {
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model ?? 'unknown',
      memoryGb: Math.round(totalmem() / 2 ** 30),
      node: process.version,
      systemCallUs: systemCallUs(),
    },
    settings,
  };
}

let exitCode = 0;
cleanUpOnInterrupt(log);
try {
  const report = await main();
  const dir = join(repoRoot, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  // A partial run (`--only`) does not overwrite the full run's results.
  const name = settings.onlyStreams ? 'streams' : 'latest';
  writeFileSync(join(dir, `${name}.json`), `${JSON.stringify(report, null, 2)}\n`);
  writeFileSync(join(dir, `${name}.md`), renderMarkdown(report));
  process.stdout.write(`${renderTable(report)}\n`);
  log(`wrote bench/results/${name}.json and bench/results/${name}.md`);
} catch (error) {
  exitCode = 1;
  log(`failed: ${(error as Error).stack ?? String(error)}`);
} finally {
  await stopAll();
  rmSync(scratch, { recursive: true, force: true });
}
process.exit(exitCode);
