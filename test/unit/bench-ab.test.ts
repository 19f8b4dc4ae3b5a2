/**
 * The A/B tool's summary (bench/ab.ts): each metric's medians, the rounds B was better in (lower latency, more
 * chats per second), and B's difference by which server was started first.
 */
import { expect, test } from 'vitest';
import { type AbRound, renderAb, type Side, summarize } from '../../bench/ab.ts';

const side = (
  adapter: number,
  rpc: number,
  chats: number,
  writes = 20,
  walletChats = Number.NaN,
  loaded: { rpc: number; adapter: number } = { rpc: Number.NaN, adapter: Number.NaN },
): Side => ({
  adapterP50Us: adapter,
  adapterP99Us: adapter * 3,
  rpcP50Us: rpc,
  rpcP99Us: rpc * 3,
  chatsPerSecond: chats,
  walletChatsPerSecond: walletChats,
  rpcPerSecond: loaded.rpc,
  adapterPerSecond: loaded.adapter,
  adapterReads: 5,
  adapterWrites: writes,
  rpcReads: 4,
  rpcWrites: writes / 2,
});

const rounds: AbRound[] = [
  { startedFirst: 'A', a: side(600, 400, 4000, 21.25), b: side(500, 380, 4100, 19.25) },
  { startedFirst: 'A', a: side(620, 420, 3900, 21.25), b: side(540, 430, 3800, 19.25) },
  { startedFirst: 'B', a: side(640, 440, 4200), b: side(520, 400, 4300) },
  { startedFirst: 'B', a: side(580, 410, 4000), b: side(560, 420, 4000) },
];

test('behavior: medians, the rounds B was better in, and B less A by which server started first', () => {
  const rows = summarize(rounds);
  const adapter = rows.find((r) => r.label.startsWith('chat upstream adapter added p50'));
  expect(adapter).toEqual({
    label: 'chat upstream adapter added p50 µs',
    digits: 0,
    a: 610,
    b: 530,
    bBetter: 4,
    rounds: 4,
    deltaAFirst: -90, // -100 and -80
    deltaBFirst: -70, // -120 and -20
  });
  const rpc = rows.find((r) => r.label.startsWith('JSON-RPC proxy added p50'));
  expect(rpc).toMatchObject({ a: 415, b: 410, bBetter: 2, deltaAFirst: -5, deltaBFirst: -15 });
  // More chats per second is better; a tie is not a win.
  const chats = rows.find((r) => r.label.startsWith('chats/s'));
  expect(chats).toMatchObject({ a: 4000, b: 4050, bBetter: 2, deltaAFirst: 0, deltaBFirst: 50 });
  // Counted, not timed: fewer system calls are better; a tie is not a win.
  const writes = rows.find((r) => r.label.startsWith('adapter: write system calls'));
  expect(writes).toMatchObject({
    digits: 1,
    a: 20.625,
    b: 19.625,
    bBetter: 2,
    deltaAFirst: -2,
    deltaBFirst: 0,
  });
  expect(rows.map((r) => r.label)).toEqual([
    'chat upstream adapter added p50 µs',
    'chat upstream adapter added p99 µs',
    'JSON-RPC proxy added p50 µs',
    'JSON-RPC proxy added p99 µs',
    'chats/s at 16 connections (local engine)',
    'adapter: write system calls per request (main thread)',
    'adapter: read system calls per request (main thread)',
    'JSON-RPC: write system calls per request (main thread)',
    'JSON-RPC: read system calls per request (main thread)',
  ]);
});

test('behavior: a half without rounds has no difference to report, and the markdown says so', () => {
  const rows = summarize(rounds.filter((r) => r.startedFirst === 'A'));
  expect(rows[0]).toMatchObject({ rounds: 2, deltaBFirst: undefined });
  const markdown = renderAb('HEAD~1', rows);
  expect(markdown).toContain('A/B: A = HEAD~1, B = the working tree');
  expect(markdown).toContain('| chat upstream adapter added p50 µs | 610 | 520 | 2 of 2 | -90 | - |');
  // Counts with one decimal; a count the kernel did not keep (NaN) reads '-'.
  expect(markdown).toContain(
    '| adapter: write system calls per request (main thread) | 21.3 | 19.3 | 2 of 2 | -2.0 | - |',
  );
  const uncounted = summarize([
    { startedFirst: 'A', a: side(1, 1, 1, Number.NaN), b: side(1, 1, 1, Number.NaN) },
  ]);
  expect(renderAb('HEAD', uncounted)).toContain(
    '| adapter: write system calls per request (main thread) | - | - | 0 of 1 | - | - |',
  );
});

test('behavior: the wallet-paid chats (AB_WALLET) are reported only when measured, more being better', () => {
  expect(summarize(rounds).some((r) => r.label.startsWith('wallet-paid'))).toBe(false);
  const rows = summarize([
    { startedFirst: 'A', a: side(1, 1, 1, 20, 1200), b: side(1, 1, 1, 20, 1300) },
    { startedFirst: 'B', a: side(1, 1, 1, 20, 1250), b: side(1, 1, 1, 20, 1150) },
  ]);
  expect(rows.find((r) => r.label.startsWith('wallet-paid'))).toEqual({
    label: 'wallet-paid chats/s at 16 connections (AB_WALLET)',
    digits: 0,
    a: 1225,
    b: 1225,
    bBetter: 1,
    rounds: 2,
    deltaAFirst: 100,
    deltaBFirst: -100,
  });
  expect(rows.map((r) => r.label).indexOf('wallet-paid chats/s at 16 connections (AB_WALLET)')).toBe(5);
});

test('behavior: the JSON-RPC calls and adapter chats under load (AB_LOADED) are reported only when measured', () => {
  expect(summarize(rounds).some((r) => r.label.includes('AB_LOADED'))).toBe(false);
  const rows = summarize([
    {
      startedFirst: 'A',
      a: side(1, 1, 1, 20, Number.NaN, { rpc: 7000, adapter: 4000 }),
      b: side(1, 1, 1, 20, Number.NaN, { rpc: 7400, adapter: 3900 }),
    },
  ]);
  expect(rows.find((r) => r.label.startsWith('JSON-RPC calls/s'))).toMatchObject({
    label: 'JSON-RPC calls/s at 16 connections (AB_LOADED)',
    a: 7000,
    b: 7400,
    bBetter: 1,
    deltaAFirst: 400,
  });
  expect(rows.find((r) => r.label.startsWith('adapter chats/s'))).toMatchObject({ b: 3900, bBetter: 0 });
  expect(rows.some((r) => r.label.startsWith('wallet-paid'))).toBe(false);
});
