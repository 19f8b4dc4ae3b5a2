/** Paths pino never writes: credentials in headers and secrets in objects (server/main.ts's logger). */
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
