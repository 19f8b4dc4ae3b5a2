import { startAnvil } from './test/support/anvil.ts';
import { startServer, TEST_ADMIN_KEY } from './test/support/server.ts';
import { execFile } from 'node:child_process';
const anvil = await startAnvil();
const server = await startServer(`sqlite:/tmp/wf-${Date.now()}.db`, { RPC_UPSTREAM_BASE_MAINNET: anvil.url }, { proxy: false });
await new Promise<void>((resolve) => execFile('node_modules/.bin/redocly', ['respect', 'test/workflows/rpc-idempotency.arazzo.yaml', '--server', `api=${server.directBase}`, '--input', `apiKey=${TEST_ADMIN_KEY}`, '--input', 'idempotencyKey=wf-1', '--json-output', '/tmp/respect.json'], { env: { ...process.env, NO_COLOR: '1' } }, (e, out, err) => { console.log(out.split('\n').filter((l) => /✗|✓ success|Reason|rror/.test(l)).join('\n')); console.log(err.slice(-1500)); resolve(); }));
const r = await fetch(server.directBase + '/billing/usage-history', { headers: { authorization: `Bearer ${TEST_ADMIN_KEY}` } }); console.log(await r.text());
await server.close(); await anvil.stop();
