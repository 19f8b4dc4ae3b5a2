/**
 * Preloaded into the server by `npm run bench:trace` (`node --import ./bench/trace-hooks.mjs server/start.mjs`):
 * stamps, with `performance.now()`, what one request goes through, without a line of the server changed.
 *
 * - `req` and `finish`: the request's arrival and its response's end (Node's `http.server.*` diagnostics
 *   channels);
 * - `sql <statement>` and `sql done`: each SQLite statement run on the server's own connection (its prepared
 *   statements, wrapped), with its verb and table: `sql begin immediate`, `sql insert ledger_entries`, `sql commit`;
 * - `http.request` and `http.request done`: around the call that makes a request to an upstream (its options,
 *   headers and the agent's socket);
 * - `upstream` and `upstream answer`: a request to an upstream (JSON-RPC node, chat provider) sent (its headers
 *   flushed to the socket), and its answer's headers read, just before its `response` event (`http.client.*`
 *   channels); the chat upstream adapter's calls go through undici instead, whose channels give
 *   `undici request` (the request made), `undici send` (its bytes about to be written to the socket),
 *   `upstream` (written), `upstream answer` (the answer's headers parsed) and `upstream end` (its body's end);
 * - `writeHead`, `end` and `ended`: the answer's headers set, and the call that writes its last bytes (before and
 *   after: a socket write to the client happens inside it);
 * - garbage collections, with their start, duration and kind (a `gc` performance observer).
 *
 * Kept in preallocated arrays; SIGUSR2 writes them as JSON to `TRACE_OUT` and starts afresh (the harness sends
 * it after its warm-up and after its measurement). Nothing is written otherwise.
 */
import dc from 'node:diagnostics_channel';
import { renameSync, writeFileSync } from 'node:fs';
import http, { ServerResponse } from 'node:http';
import https from 'node:https';
import { createRequire } from 'node:module';
import { PerformanceObserver, performance } from 'node:perf_hooks';

const CAPACITY = 4_000_000;
const ids = new Float64Array(CAPACITY);
const times = new Float64Array(CAPACITY);
const labels = [];
const labelIds = new Map();
let count = 0;
const gcs = [];

function mark(label) {
  let id = labelIds.get(label);
  if (id === undefined) {
    id = labels.length;
    labels.push(label);
    labelIds.set(label, id);
  }
  if (count < CAPACITY) {
    ids[count] = id;
    times[count] = performance.now();
    count++;
  }
}

dc.subscribe('http.server.request.start', () => mark('req'));
dc.subscribe('http.server.response.finish', () => mark('finish'));
dc.subscribe('http.client.request.start', () => mark('upstream'));
dc.subscribe('http.client.response.finish', () => mark('upstream answer'));
dc.subscribe('undici:request:create', () => mark('undici request'));
dc.subscribe('undici:client:sendHeaders', () => mark('undici send'));
dc.subscribe('undici:request:bodySent', () => mark('upstream'));
dc.subscribe('undici:request:headers', () => mark('upstream answer'));
dc.subscribe('undici:request:trailers', () => mark('upstream end'));

// `http.request` itself (the upstream call's request object made: options, headers, the agent's socket), from
// before it is called to its return; the server's modules take the wrapped function, being loaded after this.
for (const module of [http, https]) {
  const { request } = module;
  module.request = function (...args) {
    mark('http.request');
    try {
      return Reflect.apply(request, this, args);
    } finally {
      mark('http.request done');
    }
  };
}

const { writeHead, end } = ServerResponse.prototype;
ServerResponse.prototype.writeHead = function (...args) {
  mark('writeHead');
  return Reflect.apply(writeHead, this, args);
};
ServerResponse.prototype.end = function (...args) {
  mark('end');
  try {
    return Reflect.apply(end, this, args);
  } finally {
    mark('ended');
  }
};

/** `begin immediate`, `commit`, `insert ledger_entries`, `update accounts`: a statement's verb and table. */
function statementLabel(source) {
  const text = source.trim().replace(/\s+/g, ' ').replaceAll('"', '').toLowerCase();
  const table = /^(?:insert into|update|delete from|select .*? from) ([a-z_]+)/.exec(text);
  const verb = text.split(' ', 1)[0];
  return `sql ${table ? `${verb} ${table[1]}` : text.slice(0, 40)}`;
}

// The server's statements are better-sqlite3's; their prototype is reached through the first one prepared.
const require = createRequire(import.meta.url);
const Database = require('better-sqlite3');
const wrapped = new WeakSet();
const { prepare } = Database.prototype;
Database.prototype.prepare = function (...args) {
  const statement = Reflect.apply(prepare, this, args);
  const proto = Object.getPrototypeOf(statement);
  if (!wrapped.has(proto)) {
    wrapped.add(proto);
    const labelsOf = new WeakMap();
    for (const name of ['run', 'get', 'all']) {
      const original = proto[name];
      proto[name] = function (...values) {
        let label = labelsOf.get(this);
        if (label === undefined) {
          label = statementLabel(this.source);
          labelsOf.set(this, label);
        }
        mark(label);
        try {
          return Reflect.apply(original, this, values);
        } finally {
          mark('sql done');
        }
      };
    }
  }
  return statement;
};

new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) gcs.push([entry.startTime, entry.duration, entry.detail?.kind ?? 0]);
}).observe({ entryTypes: ['gc'] });

process.on('SIGUSR2', () => {
  const out = process.env.TRACE_OUT;
  if (out) {
    // Written aside and renamed into place: the reader, which waits for the file to exist, never sees it
    // half written (a large dump takes several writes).
    writeFileSync(
      `${out}.partial`,
      JSON.stringify({
        labels,
        ids: Array.from(ids.subarray(0, count)),
        times: Array.from(times.subarray(0, count)),
        gcs: gcs.splice(0),
      }),
    );
    renameSync(`${out}.partial`, out);
  }
  count = 0;
});
