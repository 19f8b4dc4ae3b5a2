/**
 * The benchmark report: its shape (what latest.json holds), the checks against the targets of the
 * performance issue, and its two renderings (a terminal table and markdown for bench/results/latest.md).
 */
import type { CpuPerRequest } from './counters.ts';

export type Row = {
  id: string;
  label: string;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  failures: number;
  peakRssMb: number;
  /**
   * CPU per request under load (counters.ts `cpuPerRequest`, medians over the rounds), µs: the target's server
   * process's main thread and its other threads (a database's own processes, PostgreSQL's, not counted), the
   * client's (the harness's process: autocannon), and the share of the machine's CPU time left idle; for a
   * `WORKERS` server, summed over its primary and workers (`mainThreads` of them, since the fortieth round).
   * Absent from reports of before the thirty-ninth round.
   */
  cpu?: CpuPerRequest;
};

export type Report = {
  when: string;
  machine: {
    cpus: number;
    cpuModel: string;
    memoryGb: number;
    node: string;
    /** One system call from Node, µs (counters.ts `systemCallUs`): which kind of VM the run had. */
    systemCallUs?: number;
  };
  settings: Record<string, number | boolean>;
  rows: Row[];
  /**
   * One connection, one request at a time, microseconds (medians over the rounds); for a target that its
   * process serves alone in its turns, what that process's main thread counted per request (counters.ts: read
   * and write system calls, medians over the rounds; absent for the others).
   */
  sequential: Record<
    string,
    { p50Us: number; p99Us: number; readsPerRequest?: number; writesPerRequest?: number }
  >;
  streams: {
    requested: number;
    completed: number;
    maxOpen: number;
    ttfbP50Ms: number;
    ttfbP99Ms: number;
    failures: number;
    firstFailure?: string;
    peakRssMb: number;
    idleRssMb: number;
    /**
     * The same process's first burst, before the measured one: as many short streams (two tokens) at once on
     * the fresh process, whose code V8 has not compiled yet, so its TTFB is a cold start's; the measured
     * burst's is a warm process's. Absent from reports of before the twenty-seventh round.
     */
    firstBurst?: {
      requested: number;
      completed: number;
      ttfbP50Ms: number;
      ttfbP99Ms: number;
      failures: number;
    };
  };
};

export type Check = { target: string; measured: string; ok: boolean };

function measures(report: Report) {
  const rps = (id: string) => report.rows.find((r) => r.id === id)?.rps ?? Number.NaN;
  const seq = (id: string) => report.sequential[id] ?? { p50Us: Number.NaN, p99Us: Number.NaN };
  const added = (proxy: string, direct: string) => ({
    p50: (seq(proxy).p50Us - seq(direct).p50Us) / 1000,
    p99: (seq(proxy).p99Us - seq(direct).p99Us) / 1000,
  });
  return { rps, added };
}

/**
 * The server against the storage floor (bench/floor.ts): what `node:http` with a request's ledger writes
 * allows on this machine, and what a bare proxy (a `node:http` server forwarding through undici, as the
 * server's upstream calls go) adds. No target: context for the ratios.
 */
export function floors(report: Report): Array<{ measure: string; value: string }> {
  const { rps, added } = measures(report);
  const ms = (a: { p50: number; p99: number }) => `p50 ${fmt(a.p50, 3)} ms, p99 ${fmt(a.p99, 3)} ms`;
  const writes = (server: string, floor: string) =>
    [server, floor].map((id) => fmt(report.sequential[id]?.writesPerRequest ?? Number.NaN, 1)).join(' / ');
  return [
    {
      measure: 'storage floor (chat writes, raw SQLite) / node:http ceiling',
      value: `${fmt((rps('floorChat') / rps('ceiling')) * 100, 1)}%`,
    },
    {
      measure: 'chat (SQLite, full path) / storage floor',
      value: `${fmt((rps('chatSqlite') / rps('floorChat')) * 100, 1)}%`,
    },
    {
      measure: 'chat with a key spend limit / without (SQLite)',
      value: `${fmt((rps('chatBudget') / rps('chatSqlite')) * 100, 1)}%`,
    },
    // Every reservation and capture of one account waits for the one before it to commit (its lock): one key
    // against as many accounts as connections, on PostgreSQL.
    // The default log level writes a line per request (its standard output to a file): what operators get.
    {
      measure: 'chat at LOG_LEVEL=info (the default) / at warn (SQLite)',
      value: `${fmt((rps('chatInfo') / rps('chatSqlite')) * 100, 1)}%`,
    },
    {
      measure: 'chat on PostgreSQL, one key / a key per connection',
      value: `${fmt((rps('chatPostgres') / rps('chatPostgresKeys')) * 100, 1)}%`,
    },
    // A wallet's sign-in (its signature checked, its nonce recorded) and its slot of five requests in flight
    // instead of the key: the same chat otherwise.
    {
      measure: 'chat, wallet EVM / API key (SQLite)',
      value: `${fmt((rps('chatWallet') / rps('chatSqlite')) * 100, 1)}%`,
    },
    {
      measure: 'chat, wallet Solana / API key (SQLite)',
      value: `${fmt((rps('chatWalletSolana') / rps('chatSqlite')) * 100, 1)}%`,
    },
    { measure: 'bare proxy added (no writes)', value: ms(added('bareProxy', 'rpcDirect')) },
    { measure: "proxy with an RPC call's ledger writes added", value: ms(added('floorRpc', 'rpcDirect')) },
    { measure: 'RPC proxy added (the server)', value: ms(added('rpcProxy', 'rpcDirect')) },
    {
      measure: "streamed chat proxy with a chat's ledger writes added",
      value: ms(added('floorUpstream', 'upstreamDirect')),
    },
    {
      measure: 'chat upstream adapter added (the server)',
      value: ms(added('upstreamProxy', 'upstreamDirect')),
    },
    {
      measure: 'the same with CHAT_CALL_BEFORE_HOLD=true (off by default)',
      value: ms(added('upstreamAhead', 'upstreamDirectAhead')),
    },
    {
      measure: 'RPC proxy added at LOG_LEVEL=info (the default)',
      value: ms(added('rpcInfo', 'rpcDirectInfo')),
    },
    {
      measure: 'chat upstream adapter added at LOG_LEVEL=info (the default)',
      value: ms(added('upstreamInfo', 'upstreamDirectInfo')),
    },
    ...chatCpuBudget(report),
    // Counted, not timed: the load does not move them (WAL frames, sockets).
    {
      measure: 'JSON-RPC proxy: write system calls per request, the server / its floor',
      value: writes('rpcProxy', 'floorRpc'),
    },
    {
      measure: 'chat upstream adapter: write system calls per request, the server / its floor',
      value: writes('upstreamProxy', 'floorUpstream'),
    },
  ];
}

export function checks(report: Report): Check[] {
  const { rps, added } = measures(report);
  const vsPrism = rps('chatSqlite') / rps('chatPrism');
  const vsCeiling = rps('chatSqlite') / rps('ceiling');
  const rpc = added('rpcProxy', 'rpcDirect');
  const upstream = added('upstreamProxy', 'upstreamDirect');
  const ahead = added('upstreamAhead', 'upstreamDirectAhead');
  const s = report.streams;
  return [
    {
      target: 'chat (SQLite, full path) / Prism mock >= 1',
      measured: `${vsPrism.toFixed(2)}x`,
      ok: vsPrism >= 1,
    },
    {
      target: 'chat (SQLite, full path) / node:http ceiling >= 20%',
      measured: `${(vsCeiling * 100).toFixed(1)}%`,
      ok: vsCeiling >= 0.2,
    },
    { target: 'RPC proxy added p50 <= 0.5 ms', measured: `${rpc.p50.toFixed(3)} ms`, ok: rpc.p50 <= 0.5 },
    { target: 'RPC proxy added p99 <= 2 ms', measured: `${rpc.p99.toFixed(3)} ms`, ok: rpc.p99 <= 2 },
    {
      target: 'chat upstream adapter added p50 <= 0.5 ms',
      measured: `${upstream.p50.toFixed(3)} ms`,
      ok: upstream.p50 <= 0.5,
    },
    {
      target: 'chat upstream adapter added p99 <= 2 ms',
      measured: `${upstream.p99.toFixed(3)} ms`,
      ok: upstream.p99 <= 2,
    },
    {
      target: 'the same with CHAT_CALL_BEFORE_HOLD=true (off by default): p50 <= 0.5 ms, p99 <= 2 ms',
      measured: `${ahead.p50.toFixed(3)} / ${ahead.p99.toFixed(3)} ms`,
      ok: ahead.p50 <= 0.5 && ahead.p99 <= 2,
    },
    {
      target: '>= 1,000 concurrent SSE streams in one process',
      measured: `${s.maxOpen} open at once, ${s.completed}/${s.requested} completed`,
      ok: s.maxOpen >= 1000 && s.completed === s.requested,
    },
    {
      target: 'peak memory of the streaming process < 300 MB',
      measured: `${s.peakRssMb.toFixed(0)} MB`,
      ok: s.peakRssMb < 300,
    },
  ];
}

const fmt = (n: number, digits = 0) => (Number.isFinite(n) ? n.toFixed(digits) : 'n/a');

/** A row's CPU per request, server and client together (NaN without its readings). */
const cpuTotal = (cpu: Row['cpu']) => (cpu ? cpu.mainUs + cpu.othersUs + cpu.clientUs : Number.NaN);

/**
 * What the chat's target of 20% of the ceiling asks of the CPU on this machine, where the server and the load
 * share the CPUs: at that rate, the CPU time a second holds (the machine's CPUs) spread over the chats, the
 * server's and the client's together; against it, what a chat took, and what its server's main thread alone
 * allows (one request at a time on that thread: its bound whatever the other CPUs do).
 */
function chatCpuBudget(report: Report): Array<{ measure: string; value: string }> {
  const chat = report.rows.find((r) => r.id === 'chatSqlite');
  const ceiling = report.rows.find((r) => r.id === 'ceiling')?.rps ?? Number.NaN;
  if (!chat?.cpu) return [];
  const budget = (report.machine.cpus * 1e6) / (0.2 * ceiling);
  return [
    {
      measure: `chat at 20% of the ceiling on ${report.machine.cpus} CPUs: CPU per chat allowed (server and client)`,
      value: `${fmt(budget, 1)} µs; measured ${fmt(cpuTotal(chat.cpu), 1)} µs (the server's main thread ${fmt(chat.cpu.mainUs, 1)} µs: at most ${fmt(1e6 / chat.cpu.mainUs)} chats/s, ${fmt(1e8 / chat.cpu.mainUs / ceiling, 1)}% of the ceiling)`,
    },
  ];
}

/** CPU per request under load, for the rows that have it (none in reports of before the thirty-ninth round). */
function cpuTable(report: Report): { head: string[]; rows: string[][] }[] {
  const rows = report.rows.flatMap(({ label, cpu }) =>
    cpu
      ? [
          [
            label,
            fmt(cpu.mainUs, 1),
            fmt(cpu.othersUs, 1),
            fmt(cpu.clientUs, 1),
            `${fmt(cpu.idlePercent)}%`,
            fmt(cpu.wakeups ?? Number.NaN, 2),
            // Each of a `WORKERS` server's main threads serves its own requests.
            fmt(((cpu.mainThreads ?? 1) * 1e6) / cpu.mainUs),
            fmt((report.machine.cpus * 1e6) / cpuTotal(cpu)),
          ],
        ]
      : [],
  );
  if (rows.length === 0) return [];
  const head = [
    'CPU per request under load',
    'server main thread µs',
    'server other threads µs',
    'client µs',
    'machine idle',
    'wake-up IPIs',
    'main thread allows req/s',
    'all CPUs allow req/s',
  ];
  return [{ head, rows }];
}

function tables(report: Report): { head: string[]; rows: string[][] }[] {
  const ceiling = report.rows.find((r) => r.id === 'ceiling')?.rps ?? Number.NaN;
  const s = report.streams;
  return [
    {
      head: ['target', 'req/s', 'vs ceiling', 'p50 ms', 'p99 ms', 'failures', 'peak RSS MB'],
      rows: report.rows.map((r) => [
        r.label,
        fmt(r.rps),
        `${fmt((r.rps / ceiling) * 100, 1)}%`,
        fmt(r.p50Ms, 1),
        fmt(r.p99Ms, 1),
        String(r.failures),
        fmt(r.peakRssMb),
      ]),
    },
    ...cpuTable(report),
    {
      head: [
        'one connection, sequential',
        'p50 µs',
        'p99 µs',
        'reads / request (main thread)',
        'writes / request (main thread)',
      ],
      rows: Object.entries(report.sequential).map(([id, l]) => [
        id,
        fmt(l.p50Us),
        fmt(l.p99Us),
        l.readsPerRequest === undefined ? '-' : fmt(l.readsPerRequest, 1),
        l.writesPerRequest === undefined ? '-' : fmt(l.writesPerRequest, 1),
      ]),
    },
    {
      head: [
        'streams',
        'requested',
        'open at once',
        'completed',
        'TTFB p50 ms',
        'TTFB p99 ms',
        'peak RSS MB',
      ],
      rows: [
        ...(s.firstBurst
          ? [
              [
                "the process's first burst (cold), 2 tokens each",
                String(s.firstBurst.requested),
                '-',
                String(s.firstBurst.completed),
                fmt(s.firstBurst.ttfbP50Ms, 1),
                fmt(s.firstBurst.ttfbP99Ms, 1),
                '-',
              ],
            ]
          : []),
        [
          s.firstBurst ? 'SSE chats, local engine (then, warm)' : 'SSE chats, local engine',
          String(s.requested),
          String(s.maxOpen),
          String(s.completed),
          fmt(s.ttfbP50Ms, 1),
          fmt(s.ttfbP99Ms, 1),
          fmt(s.peakRssMb),
        ],
      ],
    },
    {
      head: ['against the floors (no target)', 'measured'],
      rows: floors(report).map((f) => [f.measure, f.value]),
    },
    {
      head: ['target of the issue', 'measured', 'met'],
      rows: checks(report).map((c) => [c.target, c.measured, c.ok ? 'yes' : 'NO']),
    },
  ];
}

export function renderTable(report: Report): string {
  return tables(report)
    .map(({ head, rows }) => {
      const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
      const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i] ?? 0)).join('  ');
      return [line(head), widths.map((w) => '-'.repeat(w)).join('  '), ...rows.map(line)].join('\n');
    })
    .join('\n\n');
}

export function renderMarkdown(report: Report): string {
  const m = report.machine;
  const parts = [
    '# Benchmark results',
    '',
    `${report.when}; ${m.cpus} CPUs (${m.cpuModel}), ${m.memoryGb} GB, Node ${m.node}${m.systemCallUs === undefined ? '' : `, a system call ${m.systemCallUs.toFixed(2)} µs`}; settings ${JSON.stringify(report.settings)}.`,
    'Throughput rows are medians over interleaved rounds; `npm run bench` reproduces them.',
    '',
  ];
  for (const { head, rows } of tables(report)) {
    parts.push(`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`);
    for (const row of rows) parts.push(`| ${row.join(' | ')} |`);
    parts.push('');
  }
  return `${parts.join('\n')}`;
}
