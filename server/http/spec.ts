/**
 * The bundled contract as the server reads it: loaded once at start, then used for routing metadata
 * (security, admin-only marks) and by the request/response validator.
 */
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseDocument } from 'yaml';
import type { operations } from '../../generated/api.d.ts';
import { yamlValues } from '../yaml-values.ts';

export type OperationId = keyof operations;

export const BASE_PATH = '/api/v1';
export const defaultSpecPath = join(
  resolve(dirname(fileURLToPath(import.meta.url)), '..', '..'),
  'generated',
  'openapi.yaml',
);

export type SecurityRequirement = Record<string, string[]>;

/** What the server needs to know about an operation before its handler runs. */
export type OperationInfo = {
  operationId: OperationId;
  summary: string;
  method: string;
  /** Path template relative to the base path, e.g. `/api_keys/{id}`. */
  path: string;
  /** Alternatives; an empty object among them means the operation is public. */
  security: SecurityRequirement[];
  /** `ADMIN` when only admin keys may call it (`x-api-key-type`). */
  requiredKeyType: 'ADMIN' | undefined;
  /** Whether the operation documents the 402 payment-required answer (inference operations). */
  declaresPaymentRequired: boolean;
  pattern: RegExp;
};

export type ContractDocument = {
  openapi: string;
  info: { version: string; title: string };
  paths: Record<string, Record<string, unknown>>;
} & Record<string, unknown>;

export type Contract = {
  document: ContractDocument;
  version: string;
  operations: OperationInfo[];
  /** Finds the operation for a method and a path below the base path. */
  match(method: string, path: string): OperationInfo | undefined;
};

const METHODS = ['get', 'put', 'post', 'delete', 'patch', 'options', 'head'];

/**
 * What a local reference (`#/components/schemas/Name`, a JSON pointer into the document) names; undefined when
 * the reference is not local or names nothing of the document's own.
 */
export function resolveLocalRef(document: unknown, ref: string): unknown {
  if (!ref.startsWith('#/')) return undefined;
  let node: unknown = document;
  for (const part of ref.slice(2).split('/')) {
    const name = part.replaceAll('~1', '/').replaceAll('~0', '~');
    if (node === null || typeof node !== 'object' || !Object.hasOwn(node, name)) return undefined;
    node = (node as Record<string, unknown>)[name];
  }
  return node;
}

export function loadContract(specPath = defaultSpecPath): Contract {
  // Its strings one byte a character where they fit: its keys name the answers' fields (yaml-values.ts).
  const document = yamlValues(parseDocument(readFileSync(specPath, 'utf8'))) as ContractDocument;
  const operations: OperationInfo[] = [];
  for (const [path, item] of Object.entries(document.paths)) {
    for (const method of METHODS) {
      const op = item[method] as
        | {
            operationId: OperationId;
            summary?: string;
            security?: SecurityRequirement[];
            responses?: Record<string, unknown>;
          }
        | undefined;
      if (!op) continue;
      const keyType = (op as Record<string, unknown>)['x-api-key-type'];
      operations.push({
        operationId: op.operationId,
        summary: op.summary ?? op.operationId,
        method: method.toUpperCase(),
        path,
        security: op.security ?? [],
        requiredKeyType: keyType === 'ADMIN' ? 'ADMIN' : undefined,
        declaresPaymentRequired: Boolean(op.responses?.['402']),
        pattern: new RegExp(
          `^${path.replace(/[.*+?^$()|[\]\\]/g, '\\$&').replace(/\\?\{[^/}]+\\?\}/g, '[^/]+')}$`,
        ),
      });
    }
  }
  // Concrete paths win over templated ones (`/api_keys/rate_limits` before `/api_keys/{id}`).
  const ordered = [...operations].sort((a, b) => templateCount(a.path) - templateCount(b.path));
  return {
    document,
    version: document.info.version,
    operations,
    match(method, path) {
      return ordered.find((op) => op.method === method && op.pattern.test(path));
    },
  };
}

function templateCount(path: string): number {
  return (path.match(/\{/g) ?? []).length;
}

/** Whether an operation can be called without any credentials. */
export function isPublic(op: OperationInfo): boolean {
  return op.security.length === 0 || op.security.some((r) => Object.keys(r).length === 0);
}

/** Whether an operation accepts a given scheme. */
export function accepts(op: OperationInfo, scheme: 'BearerAuth' | 'siwx'): boolean {
  return op.security.some((r) => scheme in r);
}
