/**
 * The ceiling of the benchmark: a bare `node:http` server answering every request with a small JSON body.
 * Nothing this service does can be faster on the same machine; the harness reports the others against it.
 * Listens on 127.0.0.1 at the port in `PORT`.
 */
import { createServer } from 'node:http';

const body = JSON.stringify({
  object: 'list',
  data: [{ id: 'ceiling', object: 'model', owned_by: 'bench' }],
});
const server = createServer((req, res) => {
  req.resume();
  req.on('end', () => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
});
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1');
process.on('SIGTERM', () => server.close(() => process.exit(0)));
