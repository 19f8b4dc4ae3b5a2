import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    projects: [
      {
        test: {
          name: 'unit',
          include: [
            'test/unit/**/*.test.ts',
            'client/**/*.test.ts',
            'mocks/**/*.test.ts',
            'scripts/**/*.test.ts',
          ],
        },
      },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        // The JSON integration suites again, through Prism's validation proxy in front of the real server
        // (test/support/server.ts): an independent check of every response against the contract.
        test: {
          name: 'proxy',
          include: ['test/integration/api.test.ts', 'test/integration/rpc.test.ts'],
          env: { VIA_PRISM_PROXY: '1' },
          testTimeout: 60_000,
          hookTimeout: 120_000,
        },
      },
      {
        test: {
          name: 'contract',
          include: ['test/contract/**/*.test.ts'],
          testTimeout: 30_000,
          hookTimeout: 90_000,
        },
      },
    ],
  },
});
