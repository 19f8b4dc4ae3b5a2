/**
 * What bench/inproc.ts takes from the server, in one module that it compiles as `npm start` compiles the
 * server (server/compile.mjs: esbuild without `keepNames`) and imports, so that the process measured runs the
 * code production runs. Through `tsx`, every function made per request would also be renamed by
 * `__name(fn, "fn")`, an `Object.defineProperty` that normalises the function to a dictionary: about seven a
 * JSON-RPC call, some 10 µs of it under `perf` (bench/HISTORY.md, thirty-sixth round).
 */
export { createApp } from '../server/app.ts';
export { loadConfig } from '../server/config.ts';
export { createHttpServer } from '../server/http/server.ts';
export { createLogDestination } from '../server/observability/log-destination.ts';
export { createLogger } from '../server/observability/logger.ts';
export { createServices } from '../server/services.ts';
