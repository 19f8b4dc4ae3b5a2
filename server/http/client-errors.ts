/**
 * Answers requests that Node's HTTP parser refuses (CR/LF or other bytes not allowed in a header, headers over
 * the size limit, conflicting Content-Length / Transfer-Encoding framing, a malformed request line) in the
 * interface's error shape, `{error, code}`, instead of Node's default bodiless 400. These never reach Express.
 */
import { type Server, STATUS_CODES } from 'node:http';
import type { Duplex } from 'node:stream';

const MESSAGES: Record<number, [string, string]> = {
  400: ['Malformed HTTP request', 'MALFORMED_REQUEST'],
  408: ['Request timeout', 'REQUEST_TIMEOUT'],
  431: ['Request header fields too large', 'HEADERS_TOO_LARGE'],
};

/** The status Node itself would pick for a parser error. */
function statusOf(error: NodeJS.ErrnoException): number {
  if (error.code === 'HPE_HEADER_OVERFLOW') return 431;
  if (error.code === 'ERR_HTTP_REQUEST_TIMEOUT') return 408;
  return 400;
}

export function answerClientErrors(server: Server): void {
  server.on('clientError', (error: NodeJS.ErrnoException, socket: Duplex) => {
    if (error.code === 'ECONNRESET' || !socket.writable) {
      socket.destroy();
      return;
    }
    const status = statusOf(error);
    const [message, code] = MESSAGES[status] ?? (MESSAGES[400] as [string, string]);
    const body = JSON.stringify({ error: message, code });
    socket.end(
      `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
    );
  });
}
