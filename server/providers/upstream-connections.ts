/**
 * How the upstream transports (the chat upstream adapter's, the JSON-RPC proxy's) keep their connections over
 * undici: kept alive, up to 256 per upstream origin (as many as calls run at once), and undici's own header and
 * body timeouts off, as the callers' own timers bound every call. A handler given to undici's `dispatch` must
 * have `onRequestStart`: undici takes one without it for a handler of its older kind, and refuses it.
 */
export const UPSTREAM_CONNECTIONS = { connections: 256, headersTimeout: 0, bodyTimeout: 0 } as const;
