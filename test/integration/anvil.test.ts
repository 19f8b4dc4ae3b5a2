import { createPublicClient, http } from 'viem';
import { privateKeyToAccount } from 'viem/accounts';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ANVIL_PRIVATE_KEYS, type StartedAnvil, startAnvil } from '../support/anvil.ts';
import { isAlive } from '../support/process.ts';

describe('test support: anvil', () => {
  let anvil: StartedAnvil;
  beforeAll(async () => {
    anvil = await startAnvil();
  });
  afterAll(async () => {
    await anvil?.stop();
  });

  it('is a real EVM node on loopback with chain id 8453, and stops by its pid', async () => {
    const client = createPublicClient({ transport: http(anvil.url) });
    expect(await client.getChainId()).toBe(8453);
    expect(anvil.url.startsWith('http://127.0.0.1:')).toBe(true);
    // Every listed key is a funded dev account.
    for (const key of ANVIL_PRIVATE_KEYS) {
      expect(await client.getBalance({ address: privateKeyToAccount(key).address })).toBeGreaterThan(0n);
    }
    const other = await startAnvil({ chainId: 1 });
    expect(isAlive(other.pid)).toBe(true);
    await other.stop();
    expect(isAlive(other.pid)).toBe(false);
  });
});
