/**
 * The typed client with contract validation on, for the suites: every response the client receives is checked
 * against `generated/openapi.yaml` by the same JSON Schema 2020-12 validator the contract tests use
 * (test/support/contract.ts: status declared, media type declared, body schema, declared headers), every streamed
 * chat chunk against `ChatCompletionChunk`, and each validated response is recorded for the coverage gate
 * (`npm run coverage:contract`). A violation rejects the client call with `ContractViolationError`.
 */
import {
  type CheckedResponse,
  ContractViolationError,
  createServiceClient,
  type ResponseValidation,
  type ServiceClient,
  type ServiceClientOptions,
} from '../../client/index.ts';
import {
  ContractValidator,
  listOperations,
  loadBundle,
  type OpenApiDoc,
  type Operation,
} from './contract.ts';
import { recordClientCall } from './coverage.ts';

export type ContractValidation = ResponseValidation & {
  /** Every response validated so far, as `operationId status`. */
  readonly seen: string[];
};

export function contractValidation(
  doc: OpenApiDoc = loadBundle(),
  options: { record?: boolean } = {},
): ContractValidation {
  const validator = new ContractValidator(doc);
  const operations = new Map<string, Operation>(
    listOperations(doc).map((op) => [`${op.method.toUpperCase()} ${op.path}`, op]),
  );
  const chunkSchema = validator.schema('ChatCompletionChunk');
  const seen: string[] = [];
  return {
    seen,
    response(response: CheckedResponse) {
      const op = operations.get(`${response.method} ${response.path}`);
      if (!op) throw new ContractViolationError(`${response.method} ${response.path}`, ['no such operation']);
      // Bytes and event streams are read by the caller (decoders, the chunk check); here their status,
      // media type and headers are checked.
      const body =
        response.kind === 'json'
          ? { json: response.body }
          : response.kind === 'text'
            ? { text: String(response.body) }
            : { text: '' };
      const problems = validator.checkResponse(op, response.status, response.headers, body);
      if (problems.length > 0)
        throw new ContractViolationError(`${op.operationId} ${response.status}`, problems);
      seen.push(`${op.operationId} ${response.status}`);
      if (options.record ?? true) recordClientCall(op.operationId, response.status);
    },
    chunk(chunk: unknown) {
      const problems = validator.validate(chunkSchema, chunk);
      if (problems.length > 0) throw new ContractViolationError('a streamed chat chunk', problems);
    },
  };
}

/** `createServiceClient` with contract validation on. */
export function validatingClient(
  options: Omit<ServiceClientOptions, 'validation'>,
  validation: ContractValidation = contractValidation(),
): ServiceClient {
  return createServiceClient({ ...options, validation });
}

/** Calls an operation through the typed client's method for its HTTP verb (validation runs inside). */
export function sendOperation<T extends { response: Response }>(
  client: ServiceClient,
  operation: Operation,
  init: object,
): Promise<T> {
  const method = (client as unknown as Record<string, (path: string, init: object) => Promise<T>>)[
    operation.method.toUpperCase()
  ];
  if (!method) throw new Error(`the client has no ${operation.method} method`);
  return method(operation.path, init);
}
