import { describe, expect, test } from 'vitest';
import { createMetrics } from '../../server/observability/metrics.ts';

describe('createMetrics', () => {
  test('behavior: requests by operation and status, latency and upstream latency histograms, gauges', async () => {
    const metrics = createMetrics();
    metrics.observeRequest('listModels', 200, 0.004);
    metrics.observeRequest('listModels', 200, 0.3);
    metrics.observeRequest('listModels', 400, 0.001);
    metrics.observeUpstream('openai-compatible', 'ok', 0.12);
    metrics.addGauge({
      name: 'ledger_usd',
      help: 'Ledger totals.',
      read: async () => ({ 'kind="balance"': 12.5 }),
    });
    metrics.addCounter({
      name: 'ledger_entries_usd_total',
      help: 'Money moved.',
      read: async () => ({ 'type="CHARGE",currency="USD"': 0.25 }),
    });
    const text = await metrics.render();
    expect(text).toContain('# TYPE ledger_usd gauge');
    expect(text).toContain('# TYPE ledger_entries_usd_total counter');
    expect(text).toContain('ledger_entries_usd_total{type="CHARGE",currency="USD"} 0.25');
    expect(text).toContain('http_requests_total{operation="listModels",status="200"} 2');
    expect(text).toContain('http_requests_total{operation="listModels",status="400"} 1');
    expect(text).toContain('http_request_duration_seconds_bucket{operation="listModels",le="0.005"} 2');
    expect(text).toContain('http_request_duration_seconds_count{operation="listModels"} 3');
    expect(text).toContain(
      'upstream_request_duration_seconds_bucket{upstream="openai-compatible:ok",le="0.25"} 1',
    );
    expect(text).toContain(
      'upstream_request_duration_seconds_bucket{upstream="openai-compatible:ok",le="0.1"} 0',
    );
    expect(text).toContain('ledger_usd{kind="balance"} 12.5');
  });

  test('behavior: label values are escaped', async () => {
    const metrics = createMetrics();
    metrics.observeRequest('a"b\\c', 500, 0.01);
    expect(await metrics.render()).toContain('operation="a\\"b\\\\c"');
  });
});
