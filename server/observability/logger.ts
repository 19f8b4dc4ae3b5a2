/**
 * The server's logger, as `server/main.ts` makes it (and `bench/inproc.ts`, and the tests of what it writes):
 * pino at `level`, writing to `destination`, never writing the paths of `REDACT`.
 */
import { type DestinationStream, type LevelWithSilent, type Logger, pino } from 'pino';

/** Paths pino never writes: credentials in headers and secrets in objects. */
export const REDACT = [
  'req.headers.authorization',
  'req.headers["sign-in-with-x"]',
  'req.headers["x-sign-in-with-x"]',
  'req.headers["payment-signature"]',
  'req.headers["x-payment"]',
  'headers.authorization',
  '*.secret',
  '*.apiKey',
  '*.adminApiKey',
  '*.password',
];

export function createLogger(level: LevelWithSilent, destination: DestinationStream): Logger {
  return pino({ level, redact: { paths: REDACT, censor: '[redacted]' } }, destination);
}
