/**
 * The harness's report (bench/report.ts): the one-at-a-time table carries what a target's process counted per
 * request where its process served it alone, the floors' section compares each proxy with its floor and the
 * wallet-paid chats with the API-key chat, whose rows the throughput table shows like the others.
 */
import { expect, test } from 'vitest';
import { floors, type Report, renderMarkdown } from '../../bench/report.ts';

const report: Report = {
  when: '2026-11-27T13:42:18.403Z',
  machine: { cpus: 2, cpuModel: 'AMD EPYC', memoryGb: 24, node: 'v20.20.2', systemCallUs: 2.7 },
  settings: { rounds: 3 },
  rows: [
    { id: 'ceiling', label: 'ceiling', rps: 30000, p50Ms: 0, p99Ms: 1, failures: 0, peakRssMb: 70 },
    { id: 'chatSqlite', label: 'chat', rps: 3000, p50Ms: 5, p99Ms: 10, failures: 0, peakRssMb: 240 },
    {
      id: 'chatPostgres',
      label: 'chat, PostgreSQL',
      rps: 400,
      p50Ms: 38,
      p99Ms: 70,
      failures: 0,
      peakRssMb: 220,
    },
    {
      id: 'chatPostgresKeys',
      label: 'chat, local engine, a key per connection, PostgreSQL',
      rps: 800,
      p50Ms: 19,
      p99Ms: 45,
      failures: 0,
      peakRssMb: 220,
    },
    {
      id: 'chatWallet',
      label: 'chat, local engine, wallet (EVM sign-in), SQLite',
      rps: 1200,
      p50Ms: 12,
      p99Ms: 30,
      failures: 0,
      peakRssMb: 330,
    },
    {
      id: 'chatWalletSolana',
      label: 'chat, local engine, wallet (Solana sign-in), SQLite',
      rps: 45,
      p50Ms: 350,
      p99Ms: 420,
      failures: 0,
      peakRssMb: 330,
    },
  ],
  sequential: {
    upstreamProxy: { p50Us: 1477, p99Us: 4643, readsPerRequest: 2, writesPerRequest: 37.84 },
    floorUpstream: { p50Us: 845, p99Us: 3452, readsPerRequest: 2, writesPerRequest: 31.2 },
    upstreamDirect: { p50Us: 126, p99Us: 1170 },
    rpcProxy: { p50Us: 1035, p99Us: 4468, readsPerRequest: 2, writesPerRequest: 38.2 },
    floorRpc: { p50Us: 819, p99Us: 3757, readsPerRequest: 2, writesPerRequest: 36.04 },
    rpcDirect: { p50Us: 108, p99Us: 1786 },
  },
  streams: {
    requested: 1000,
    completed: 1000,
    maxOpen: 1000,
    ttfbP50Ms: 900,
    ttfbP99Ms: 1500,
    failures: 0,
    peakRssMb: 248,
    idleRssMb: 100,
    firstBurst: { requested: 1000, completed: 1000, ttfbP50Ms: 1250, ttfbP99Ms: 2400, failures: 0 },
  },
};

test('behavior: counts per request in the one-at-a-time table, "-" where a process served several targets', () => {
  const markdown = renderMarkdown(report);
  expect(markdown).toContain('a system call 2.70 µs');
  expect(markdown).toContain(
    '| one connection, sequential | p50 µs | p99 µs | reads / request (main thread) | writes / request (main thread) |',
  );
  expect(markdown).toContain('| upstreamProxy | 1477 | 4643 | 2.0 | 37.8 |');
  expect(markdown).toContain('| upstreamDirect | 126 | 1170 | - | - |');
});

test("behavior: the floors compare each proxy's write system calls with its floor's", () => {
  const row = (start: string, of = report) => floors(of).find((f) => f.measure.startsWith(start))?.value;
  expect(row('chat upstream adapter: write system calls')).toBe('37.8 / 31.2');
  expect(row('JSON-RPC proxy: write system calls')).toBe('38.2 / 36.0');
  const uncounted = { ...report, sequential: {} };
  expect(row('chat upstream adapter: write system calls', uncounted)).toBe('n/a / n/a');
  expect(row('JSON-RPC proxy: write system calls', uncounted)).toBe('n/a / n/a');
});

test('behavior: the wallet-paid chats are rows like the others and ratios to the API-key chat in the floors', () => {
  const markdown = renderMarkdown(report);
  expect(markdown).toContain(
    '| chat, local engine, wallet (EVM sign-in), SQLite | 1200 | 4.0% | 12.0 | 30.0 | 0 | 330 |',
  );
  expect(markdown).toContain(
    '| chat, local engine, wallet (Solana sign-in), SQLite | 45 | 0.1% | 350.0 | 420.0 | 0 | 330 |',
  );
  expect(markdown).toContain('| chat, wallet EVM / API key (SQLite) | 40.0% |');
  expect(markdown).toContain('| chat, wallet Solana / API key (SQLite) | 1.5% |');
  const row = (start: string, of = report) => floors(of).find((f) => f.measure === start)?.value;
  const walletless = { ...report, rows: report.rows.filter((r) => !r.id.startsWith('chatWallet')) };
  expect(row('chat, wallet EVM / API key (SQLite)', walletless)).toBe('n/a%');
  expect(row('chat, wallet Solana / API key (SQLite)', walletless)).toBe('n/a%');
});

test('behavior: the PostgreSQL chat with one key is a ratio to the same with a key per connection', () => {
  const row = (start: string, of = report) => floors(of).find((f) => f.measure === start)?.value;
  expect(renderMarkdown(report)).toContain(
    '| chat, local engine, a key per connection, PostgreSQL | 800 | 2.7% |',
  );
  expect(row('chat on PostgreSQL, one key / a key per connection')).toBe('50.0%');
  const without = { ...report, rows: report.rows.filter((r) => r.id !== 'chatPostgresKeys') };
  expect(row('chat on PostgreSQL, one key / a key per connection', without)).toBe('n/a%');
});

test('behavior: the server at LOG_LEVEL=info is a ratio to the same chat at warn and an added latency of each proxy', () => {
  const atInfo: Report = {
    ...report,
    rows: [
      ...report.rows,
      {
        id: 'chatInfo',
        label: 'chat, local engine, API key, SQLite, LOG_LEVEL=info (the default)',
        rps: 2700,
        p50Ms: 6,
        p99Ms: 11,
        failures: 0,
        peakRssMb: 240,
      },
    ],
    sequential: {
      ...report.sequential,
      rpcInfo: { p50Us: 1100, p99Us: 4600, readsPerRequest: 2, writesPerRequest: 38.3 },
      rpcDirectInfo: { p50Us: 110, p99Us: 1800 },
      upstreamInfo: { p50Us: 1500, p99Us: 4700, readsPerRequest: 2, writesPerRequest: 37.9 },
      upstreamDirectInfo: { p50Us: 125, p99Us: 1200 },
    },
  };
  const row = (start: string, of = atInfo) => floors(of).find((f) => f.measure === start)?.value;
  expect(row('chat at LOG_LEVEL=info (the default) / at warn (SQLite)')).toBe('90.0%');
  expect(row('RPC proxy added at LOG_LEVEL=info (the default)')).toBe('p50 0.990 ms, p99 2.800 ms');
  expect(row('chat upstream adapter added at LOG_LEVEL=info (the default)')).toBe(
    'p50 1.375 ms, p99 3.500 ms',
  );
  expect(renderMarkdown(atInfo)).toContain('| rpcInfo | 1100 | 4600 | 2.0 | 38.3 |');
  // A report of before the row (or a run without it) says so rather than a number.
  expect(row('chat at LOG_LEVEL=info (the default) / at warn (SQLite)', report)).toBe('n/a%');
  expect(row('RPC proxy added at LOG_LEVEL=info (the default)', report)).toBe('p50 n/a ms, p99 n/a ms');
});

test("behavior: the streams table has the process's first burst (cold) above the measured one (warm)", () => {
  const markdown = renderMarkdown(report);
  expect(markdown).toContain(
    "| the process's first burst (cold), 2 tokens each | 1000 | - | 1000 | 1250.0 | 2400.0 | - |",
  );
  expect(markdown).toContain(
    '| SSE chats, local engine (then, warm) | 1000 | 1000 | 1000 | 900.0 | 1500.0 | 248 |',
  );
  const { firstBurst: _, ...older } = report.streams;
  expect(renderMarkdown({ ...report, streams: older })).toContain(
    '| SSE chats, local engine | 1000 | 1000 | 1000 | 900.0 | 1500.0 | 248 |',
  );
});

test("behavior: CPU per request under load is a table of the rows that have it, and the chat's CPU budget at 20% of the ceiling a floor", () => {
  const withCpu: Report = {
    ...report,
    rows: report.rows.map((r) =>
      r.id === 'ceiling'
        ? { ...r, cpu: { mainUs: 10, othersUs: 0, clientUs: 12.5, idlePercent: 4 } }
        : r.id === 'chatSqlite'
          ? { ...r, cpu: { mainUs: 125, othersUs: 7.5, clientUs: 17.5, idlePercent: 38, wakeups: 0.174 } }
          : r,
    ),
  };
  const markdown = renderMarkdown(withCpu);
  expect(markdown).toContain(
    '| CPU per request under load | server main thread µs | server other threads µs | client µs | machine idle | wake-up IPIs | main thread allows req/s | all CPUs allow req/s |',
  );
  // 2 CPUs: 2,000,000 µs a second over 22.5 µs a request; the main thread alone, 1,000,000 over 10. A row
  // without the machine's wake-ups (a report of before them, or a kernel that does not count them): n/a.
  expect(markdown).toContain('| ceiling | 10.0 | 0.0 | 12.5 | 4% | n/a | 100000 | 88889 |');
  expect(markdown).toContain('| chat | 125.0 | 7.5 | 17.5 | 38% | 0.17 | 8000 | 13333 |');
  expect(markdown).not.toContain('| chat, PostgreSQL | n/a');
  // 20% of 30,000 a second is 6,000 chats: 2,000,000 µs of CPU over them, 333.3 µs each.
  const budget = floors(withCpu).find((f) => f.measure.startsWith('chat at 20% of the ceiling on 2 CPUs'));
  expect(budget?.value).toBe(
    "333.3 µs; measured 150.0 µs (the server's main thread 125.0 µs: at most 8000 chats/s, 26.7% of the ceiling)",
  );
  // A `WORKERS=2` row: its main threads' time summed, each thread serving its own requests.
  const workers: Report = {
    ...withCpu,
    rows: [
      ...withCpu.rows,
      {
        id: 'chatWorkers',
        label: 'chat, WORKERS=2',
        rps: 8_000,
        p50Ms: 1,
        p99Ms: 4,
        failures: 0,
        peakRssMb: 400,
        cpu: { mainUs: 180, othersUs: 20, clientUs: 25, idlePercent: 3, mainThreads: 2 },
      },
    ],
  };
  expect(renderMarkdown(workers)).toContain(
    '| chat, WORKERS=2 | 180.0 | 20.0 | 25.0 | 3% | n/a | 11111 | 8889 |',
  );
  // A report of before the readings has neither.
  expect(renderMarkdown(report)).not.toContain('CPU per request under load');
  expect(floors(report).some((f) => f.measure.startsWith('chat at 20% of the ceiling'))).toBe(false);
});
