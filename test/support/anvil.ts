/**
 * A real EVM node for tests, from npm alone: the `anvil` binary inside `@foundry-rs/anvil-linux-amd64` (we
 * depend on the platform package itself: the registry mirror has no other platform package of
 * `@foundry-rs/anvil`, so a lockfile with the umbrella package fails `npm ci`; nothing is downloaded).
 * Loopback only, a free port, stopped by its pid, also when the test fails.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { freePort, stopPid } from './process.ts';

export type StartedAnvil = {
  /** JSON-RPC URL on 127.0.0.1. */
  url: string;
  port: number;
  pid: number;
  chainId: number;
  /** Sends one JSON-RPC call straight to the node (no proxy). */
  rpc<T = unknown>(method: string, params?: unknown[]): Promise<T>;
  stop(): Promise<void>;
};

/** The anvil dev accounts' well-known private keys (mnemonic "test test … junk"); funded with 10,000 ETH. */
export const ANVIL_PRIVATE_KEYS = [
  '0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80',
  '0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d',
  '0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a',
  '0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6',
] as const;

export function anvilBinary(): string {
  const require = createRequire(import.meta.url);
  const platformPackage = `@foundry-rs/anvil-${process.platform}-${process.arch === 'x64' ? 'amd64' : process.arch}`;
  return join(dirname(require.resolve(`${platformPackage}/package.json`)), 'bin', 'anvil');
}

/** Starts anvil (default chain id 8453, Base) and waits until it answers `eth_chainId`. */
export async function startAnvil(options: { chainId?: number; args?: string[] } = {}): Promise<StartedAnvil> {
  const chainId = options.chainId ?? 8453;
  const port = await freePort();
  const child: ChildProcess = spawn(
    anvilBinary(),
    [
      '--host',
      '127.0.0.1',
      '--port',
      String(port),
      '--chain-id',
      String(chainId),
      '--silent',
      ...(options.args ?? []),
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const pid = child.pid;
  if (pid === undefined) throw new Error('anvil did not start');
  const url = `http://127.0.0.1:${port}`;
  let nextId = 1;
  const rpc = async <T>(method: string, params: unknown[] = []): Promise<T> => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: nextId++, method, params }),
    });
    const body = (await response.json()) as { result?: T; error?: { message: string } };
    if (body.error) throw new Error(`${method}: ${body.error.message}`);
    return body.result as T;
  };
  const stop = () => stopPid(pid);

  const deadline = Date.now() + 20_000;
  for (;;) {
    try {
      const id = await rpc<string>('eth_chainId');
      if (Number.parseInt(id, 16) === chainId) break;
    } catch {}
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      throw new Error(`anvil did not start: ${stderr.slice(-2000)}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  return { url, port, pid, chainId, rpc, stop };
}
