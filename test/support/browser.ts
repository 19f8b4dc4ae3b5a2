/**
 * A headless Chromium for browser tests, from npm alone: the binary ships compressed inside
 * `@sparticuz/chromium` (unpacked once into the temp directory), or `CHROMIUM_PATH` names another one (e.g.
 * Debian's `/usr/bin/chromium`). The test starts the process itself, on a fresh profile with no background
 * networking, and drives it with playwright-core over the DevTools protocol; `close()` stops it by its pid,
 * also when the test failed.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type Browser, chromium } from 'playwright-core';
import { stopPid } from './process.ts';

export type StartedBrowser = { browser: Browser; pid: number; close(): Promise<void> };

/** Flags for a closed network: no first-run, sync, update or component traffic. */
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--no-default-browser-check',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-dev-shm-usage',
  '--remote-debugging-address=127.0.0.1',
  '--remote-debugging-port=0',
];

export async function chromiumPath(): Promise<string> {
  const override = process.env.CHROMIUM_PATH;
  if (override) {
    if (!existsSync(override)) throw new Error(`CHROMIUM_PATH=${override} does not exist`);
    return override;
  }
  try {
    const { default: packaged } = await import('@sparticuz/chromium');
    return await packaged.executablePath();
  } catch (error) {
    throw new Error(
      `No Chromium for the browser tests: @sparticuz/chromium could not be unpacked (${String(error)}); ` +
        'run `npm ci`, or set CHROMIUM_PATH to a Chromium (e.g. `apt-get install -y chromium`, then CHROMIUM_PATH=/usr/bin/chromium)',
    );
  }
}

export async function startBrowser(): Promise<StartedBrowser> {
  const executable = await chromiumPath();
  const profile = mkdtempSync(join(tmpdir(), 'chromium-profile-'));
  const child = spawn(executable, [...FLAGS, `--user-data-dir=${profile}`, 'about:blank'], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  const pid = child.pid;
  const cleanup = async () => {
    if (pid) await stopPid(pid);
    rmSync(profile, { recursive: true, force: true });
  };
  try {
    if (!pid) throw new Error(`Chromium did not start: ${executable}`);
    const endpoint = await devtoolsEndpoint(child);
    const browser = await chromium.connectOverCDP(endpoint);
    return {
      browser,
      pid,
      async close() {
        await browser.close().catch(() => undefined);
        await cleanup();
      },
    };
  } catch (error) {
    await cleanup();
    throw error;
  }
}

/** Chromium prints `DevTools listening on ws://…` on stderr once it accepts connections. */
function devtoolsEndpoint(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = '';
    const onData = (data: Buffer) => {
      output += data.toString();
      const match = /DevTools listening on (ws:\/\/\S+)/.exec(output);
      if (match?.[1]) {
        child.stderr?.off('data', onData);
        child.stderr?.resume();
        resolve(match[1]);
      }
    };
    child.stderr?.on('data', onData);
    child.once('exit', (code, signal) =>
      reject(new Error(`Chromium exited (${code ?? signal}) before listening:\n${output.slice(-2000)}`)),
    );
    child.once('error', reject);
  });
}
