/**
 * A loopback JSON-RPC node stand-in for what cannot run here (no Solana validator from npm) and for broken
 * nodes: it answers a few Solana methods like a real node, or answers garbage or 500, or holds every request
 * until released. It records every request it receives, so tests can tell whether the proxy called it.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export type StandInMode = 'solana' | 'garbage' | 'error500' | 'hang';

export type RpcStandIn = {
  url: string;
  /** Parsed bodies of the requests received, in order. */
  requests: unknown[];
  /** From now on, requests wait until the returned function is called. */
  hold(): () => void;
  close(): Promise<void>;
};

type Call = { jsonrpc?: string; id?: unknown; method?: string };

const SLOT = 312_345_678;

function solanaAnswer(call: Call) {
  const base = { jsonrpc: '2.0', id: call.id ?? null };
  switch (call.method) {
    case 'getBalance':
      return { ...base, result: { context: { slot: SLOT, apiVersion: '2.2.0' }, value: 1_500_000_000 } };
    case 'getSlot':
      return { ...base, result: SLOT };
    case 'getSupply':
      return {
        ...base,
        result: {
          context: { slot: SLOT },
          value: {
            total: 590_000_000,
            circulating: 500_000_000,
            nonCirculating: 90_000_000,
            nonCirculatingAccounts: [],
          },
        },
      };
    default:
      return { ...base, error: { code: -32601, message: 'Method not found' } };
  }
}

export async function startRpcStandIn(mode: StandInMode): Promise<RpcStandIn> {
  const requests: unknown[] = [];
  let gate: Promise<void> | undefined;
  const open = new Set<ServerResponse>();

  const answer = (parsed: unknown, res: ServerResponse) => {
    if (mode === 'hang') return;
    if (mode === 'garbage') {
      res.writeHead(200, { 'content-type': 'text/html' }).end('<html>upstream maintenance</html>');
      return;
    }
    if (mode === 'error500') {
      res.writeHead(500, { 'content-type': 'text/plain' }).end('internal error');
      return;
    }
    const result = Array.isArray(parsed)
      ? parsed.map((call) => solanaAnswer(call as Call))
      : solanaAnswer(parsed as Call);
    // A real node's content type may carry a charset; the proxy forces plain application/json.
    res.writeHead(200, { 'content-type': 'application/json; charset=utf-8' }).end(JSON.stringify(result));
  };

  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    open.add(res);
    res.on('close', () => open.delete(res));
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      let parsed: unknown;
      try {
        parsed = JSON.parse(Buffer.concat(chunks).toString('utf8'));
      } catch {
        parsed = undefined;
      }
      requests.push(parsed);
      const waitFor = gate;
      if (waitFor) void waitFor.then(() => answer(parsed, res));
      else answer(parsed, res);
    });
  });
  server.listen(0, '127.0.0.1');
  await new Promise<void>((resolve) => server.once('listening', () => resolve()));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    hold() {
      let release!: () => void;
      gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      return () => {
        gate = undefined;
        release();
      };
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const res of open) res.destroy();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
