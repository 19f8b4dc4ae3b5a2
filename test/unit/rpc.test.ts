import { describe, expect, test } from 'vitest';
import { billAnswer, planRequest } from '../../server/domains/rpc/billing.ts';
import { classifyMethod } from '../../server/domains/rpc/methods.ts';
import { RpcConfigError, resolveNetworks, upstreamVariable } from '../../server/domains/rpc/networks.ts';

const networks = resolveNetworks({ upstreamsBySlug: {}, section: undefined, timeoutMs: 1000 });
const net = (slug: string) => {
  const n = networks.get(slug);
  if (!n) throw new Error(slug);
  return n;
};
const item = (method: string, id: unknown = 1) => ({ jsonrpc: '2.0', id, method, params: [] });

describe('classifyMethod', () => {
  test('behavior: tiers and refusals per family', () => {
    expect(classifyMethod('evm', 'eth_call')).toEqual({ allowed: true, tier: 1 });
    expect(classifyMethod('evm', 'zks_getL2ToL1LogProof')).toEqual({ allowed: true, tier: 1 });
    expect(classifyMethod('evm', 'debug_traceTransaction')).toEqual({ allowed: true, tier: 2 });
    expect(classifyMethod('evm', 'arbtrace_block')).toEqual({ allowed: true, tier: 2 });
    expect(classifyMethod('evm', 'arbtrace_replayTransaction')).toEqual({ allowed: true, tier: 4 });
    expect(classifyMethod('evm', 'eth_subscribe')).toEqual({ allowed: false, reason: 'websocket' });
    expect(classifyMethod('evm', 'eth_uninstallFilter')).toEqual({ allowed: false, reason: 'filter' });
    expect(classifyMethod('evm', 'personal_sign')).toEqual({ allowed: false, reason: 'key' });
    expect(classifyMethod('evm', 'getBalance')).toEqual({ allowed: false, reason: 'unsupported' });
    expect(classifyMethod('solana', 'getSupply')).toEqual({ allowed: true, tier: 4 });
    expect(classifyMethod('solana', 'slotSubscribe')).toEqual({ allowed: false, reason: 'websocket' });
    expect(classifyMethod('solana', 'getConfirmedBlock')).toEqual({ allowed: false, reason: 'unsupported' });
    expect(classifyMethod('starknet', 'starknet_call')).toEqual({ allowed: true, tier: 1 });
    expect(classifyMethod('starknet', 'starknet_subscribeNewHeads')).toEqual({
      allowed: false,
      reason: 'websocket',
    });
    expect(classifyMethod('starknet', 'eth_call')).toEqual({ allowed: false, reason: 'unsupported' });
  });
});

describe('planRequest / billAnswer', () => {
  test('behavior: worst case reserves max(tier, 5) per item; a low base still covers error items', () => {
    expect(planRequest(net('zksync-mainnet'), item('trace_block')).worstCase).toBe(60);
    const cheap = { ...net('robinhood-mainnet'), baseCredits: 2 };
    expect(planRequest(cheap, [item('eth_call', 1), item('eth_call', 2)]).worstCase).toBe(10);
  });

  test('behavior: batch items are paired by id, errors cost 5, unanswered items nothing', () => {
    const plan = planRequest(net('base-mainnet'), [
      item('eth_call', 1),
      item('txpool_content', '1'),
      item('eth_chainId', 3),
    ]);
    const answer = Buffer.from(
      JSON.stringify([
        { jsonrpc: '2.0', id: '1', result: {} },
        { jsonrpc: '2.0', id: 1, error: { code: 3, message: 'reverted' } },
      ]),
    );
    expect(billAnswer(plan, answer)).toBe(80 + 5);
  });

  test('behavior: what is not JSON-RPC is rejected (the upstream fails over)', () => {
    const plan = planRequest(net('base-mainnet'), item('eth_call'));
    expect(billAnswer(plan, Buffer.from('<html>'))).toBeUndefined();
    expect(billAnswer(plan, Buffer.from('{"jsonrpc":"2.0","id":1}'))).toBeUndefined();
    expect(billAnswer(plan, Buffer.from('{"jsonrpc":"2.0","id":1,"result":null}'))).toBe(20);
  });
});

describe('resolveNetworks', () => {
  test('behavior: environment upstreams win over the file; file sets prices and timeouts', () => {
    const resolved = resolveNetworks({
      upstreamsBySlug: { 'base-mainnet': ['http://env:1'] },
      section: {
        networks: {
          'base-mainnet': { upstreams: ['http://file:1'] },
          'robinhood-mainnet': { baseCredits: 40, upstreams: ['http://file:2'], timeoutMs: 500 },
        },
      },
      timeoutMs: 1000,
    });
    expect(resolved.get('base-mainnet')?.upstreams).toEqual([{ url: 'http://env:1', timeoutMs: 1000 }]);
    expect(resolved.get('robinhood-mainnet')).toMatchObject({
      baseCredits: 40,
      upstreams: [{ url: 'http://file:2', timeoutMs: 500 }],
    });
    expect(resolved.get('ethereum-mainnet')?.upstreams).toEqual([]);
    expect(upstreamVariable('ethereum-mainnet')).toBe('RPC_UPSTREAM_ETHEREUM_MAINNET');
  });

  test('behavior: an unknown network or key in the file is a start-up error naming it', () => {
    expect(() =>
      resolveNetworks({
        upstreamsBySlug: {},
        section: { networks: { 'doge-mainnet': {} } },
        timeoutMs: 1000,
      }),
    ).toThrow(RpcConfigError);
    expect(() =>
      resolveNetworks({
        upstreamsBySlug: {},
        section: { networks: { 'base-mainnet': { upstream: 'x' } } },
        timeoutMs: 1000,
      }),
    ).toThrow(/upstream/);
  });
});
