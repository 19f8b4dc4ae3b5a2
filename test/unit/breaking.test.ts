/**
 * The breaking-change gate, tested with seeded changes to the real bundle: each kind of break is reported,
 * additive changes are not, and intentional changes pass only when listed with a reason.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, test } from 'vitest';
import { stringify } from 'yaml';
import {
  applyAllowances,
  type BreakingChange,
  compareSpecs,
  loadAllowances,
} from '../../scripts/breaking.ts';
import { loadBundle, repoRoot } from '../support/contract.ts';

// biome-ignore lint/suspicious/noExplicitAny: the seeded mutations walk the bundle's untyped tree.
type Json = Record<string, any>;
const base = loadBundle() as Json;
const mutate = (change: (doc: Json) => void): Json => {
  const doc = structuredClone(base);
  change(doc);
  return doc;
};
const kinds = (changes: BreakingChange[]) => changes.map((c) => c.kind);
const schemas = (doc: Json) => doc.components.schemas;

describe('breaking-change gate', () => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-breaking-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('behavior: the bundle compared with itself has no breaking change', () => {
    expect(compareSpecs(base, structuredClone(base))).toEqual([]);
  });

  test.each([
    ['removed-operation', (d: Json) => delete d.paths['/models/traits'].get, 'GET /models/traits'],
    [
      'removed-request-field',
      (d: Json) => delete schemas(d).ChatCompletionRequest.properties.seed,
      'POST /chat/completions requestBody application/json .seed',
    ],
    [
      'newly-required-request-field',
      (d: Json) => schemas(d).ChatCompletionRequest.required.push('seed'),
      'POST /chat/completions requestBody application/json .seed',
    ],
    [
      'narrowed-enum',
      (d: Json) => {
        schemas(d).ChatReasoningEffort.enum = ['low', 'medium', 'high'];
      },
      'POST /chat/completions requestBody application/json .reasoning_effort',
    ],
    [
      'narrowed-type',
      (d: Json) => {
        schemas(d).ChatCompletionRequest.properties.seed.type = 'string';
      },
      'POST /chat/completions requestBody application/json .seed',
    ],
    [
      'removed-response-field',
      (d: Json) => delete schemas(d).ChatCompletion.properties.usage,
      'POST /chat/completions 200 application/json .usage',
    ],
    [
      'response-field-no-longer-required',
      (d: Json) => {
        schemas(d).ChatCompletion.required = ['created', 'id', 'model', 'object'];
      },
      'POST /chat/completions 200 application/json .usage',
    ],
    [
      'removed-parameter',
      (d: Json) => {
        d.paths['/billing/usage-history'].get.parameters.shift();
      },
      'GET /billing/usage-history query:startTimestamp',
    ],
    [
      'newly-required-parameter',
      (d: Json) => {
        d.paths['/billing/usage-history'].get.parameters[0].required = true;
      },
      'GET /billing/usage-history query:startTimestamp',
    ],
    ['removed-response', (d: Json) => delete d.paths['/models'].get.responses['200'], 'GET /models 200'],
    [
      'changed-response-type',
      (d: Json) => {
        schemas(d).ChatCompletion.properties.created = { type: 'string' };
      },
      'POST /chat/completions 200 application/json .created',
    ],
    [
      'removed-response-example',
      (d: Json) => {
        const media = d.paths['/models'].get.responses['200'].content['application/json'];
        media.examples = Object.fromEntries(
          Object.entries(media.examples).map(([name, example], i) => [
            i === 0 ? `${name}Renamed` : name,
            example,
          ]),
        );
      },
      `GET /models 200 application/json example:${Object.keys(base.paths['/models'].get.responses['200'].content['application/json'].examples)[0]}`,
    ],
  ])('behavior: a seeded %s is reported', (kind, change, where) => {
    const changes = compareSpecs(base, mutate(change));
    expect(changes.map((c) => c.id)).toContain(`${kind} ${where}`);
    expect(new Set(kinds(changes))).toEqual(new Set([kind]));
  });

  test('behavior: additive changes pass (new operation, optional field, wider enum, new response field)', () => {
    const next = mutate((d) => {
      d.paths['/brand-new'] = { get: structuredClone(d.paths['/models'].get) };
      schemas(d).ChatCompletionRequest.properties.new_option = { type: 'boolean' };
      schemas(d).ChatReasoningEffort.enum.push('extreme');
      schemas(d).ChatCompletion.properties.extra = { type: 'string' };
      schemas(d).ChatCompletionRequest.properties.seed.type = ['integer', 'string'];
    });
    expect(compareSpecs(base, next)).toEqual([]);
  });

  test('behavior: an intentional change passes only when listed with a reason', () => {
    const changes = compareSpecs(
      base,
      mutate((d) => delete d.paths['/models/traits'].get),
    );
    const file = join(dir, 'allow.yaml');
    writeFileSync(
      file,
      stringify({ intentional: [{ change: 'removed-operation GET /models/traits', reason: 'v2' }] }),
    );
    expect(applyAllowances(changes, loadAllowances(file))).toMatchObject({
      blocking: [],
      intentional: changes,
    });
    writeFileSync(file, stringify({ intentional: [{ change: 'removed-operation GET /models/traits' }] }));
    expect(() => loadAllowances(file)).toThrow(/reason/);
  });

  test('behavior: the command fails on a breaking change against an older bundle and passes on the same one', () => {
    const run = (old: Json) => {
      const file = join(dir, 'old.yaml');
      writeFileSync(file, stringify(old));
      try {
        execFileSync(process.execPath, ['--import', 'tsx', 'scripts/breaking.ts', '--old', file], {
          cwd: repoRoot,
          stdio: 'pipe',
          encoding: 'utf8',
        });
        return { code: 0, stderr: '' };
      } catch (error) {
        const failed = error as { status: number; stderr: string };
        return { code: failed.status, stderr: failed.stderr };
      }
    };
    expect(run(base).code).toBe(0);
    // The current bundle lacks a field that the "old" one had: a removed response field.
    const older = structuredClone(base);
    older.components.schemas.ChatCompletion.properties.legacy_field = { type: 'string' };
    const result = run(older);
    expect(result.code).toBe(1);
    expect(result.stderr).toContain(
      'removed-response-field POST /chat/completions 200 application/json .legacy_field',
    );
  }, 60_000);
});
