/** The part of autocannon's API the harness uses (the package ships no types). */
declare module 'autocannon' {
  /** A request as autocannon builds it, which `setupRequest` may change and must return. */
  export type RequestData = {
    method: string;
    path: string;
    headers: Record<string, string>;
    body?: string | Buffer;
  };
  export type Request = {
    method?: 'GET' | 'POST';
    path?: string;
    headers?: Record<string, string>;
    body?: string;
    setupRequest?: (request: RequestData, context: Record<string, unknown>) => RequestData;
  };
  /** One connection's client, as `setupClient` receives it. */
  export type Client = { setRequests(requests: Request[]): void };
  type Options = {
    url: string;
    method?: 'GET' | 'POST';
    headers?: Record<string, string>;
    body?: string;
    connections?: number;
    duration?: number;
    pipelining?: number;
    timeout?: number;
    setupClient?: (client: Client) => void;
  };
  type Histogram = { average: number; p50: number; p99: number; max: number };
  type Result = {
    requests: Histogram & { total: number };
    latency: Histogram;
    errors: number;
    timeouts: number;
    non2xx: number;
    '2xx': number;
  };
  function autocannon(options: Options): Promise<Result>;
  export default autocannon;
}
