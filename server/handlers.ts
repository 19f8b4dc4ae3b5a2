/**
 * The operation table: one handler per operationId of the contract. `satisfies HandlerTable` makes a missing
 * or misspelt operation a compile error. Operations whose issue has not landed yet answer
 * 501 `{"error": "Not implemented"}`.
 */
import type { Handler, HandlerTable } from './http/contract.ts';
import { notImplemented } from './http/errors.ts';
import type { OperationId } from './http/spec.ts';

/** A handler for an operation that is not built yet. */
export function notImplementedHandler<K extends OperationId>(): Handler<K> {
  return async () => {
    throw notImplemented();
  };
}

export type HandlerGroups = Partial<HandlerTable>;

/** Builds the table from the domain handler groups; anything not provided answers 501. */
export function createHandlers(groups: HandlerGroups): HandlerTable {
  const table = {
    createChatCompletion: notImplementedHandler<'createChatCompletion'>(),
    generateImage: notImplementedHandler<'generateImage'>(),
    createImage: notImplementedHandler<'createImage'>(),
    listImageStyles: notImplementedHandler<'listImageStyles'>(),
    createEmbedding: notImplementedHandler<'createEmbedding'>(),
    createSpeech: notImplementedHandler<'createSpeech'>(),
    createTranscription: notImplementedHandler<'createTranscription'>(),
    quoteVideo: notImplementedHandler<'quoteVideo'>(),
    queueVideo: notImplementedHandler<'queueVideo'>(),
    retrieveVideo: notImplementedHandler<'retrieveVideo'>(),
    completeVideo: notImplementedHandler<'completeVideo'>(),
    createDecision: notImplementedHandler<'createDecision'>(),
    listCharacters: notImplementedHandler<'listCharacters'>(),
    getCharacter: notImplementedHandler<'getCharacter'>(),
    listModels: notImplementedHandler<'listModels'>(),
    listModelTraits: notImplementedHandler<'listModelTraits'>(),
    listModelCompatibilityMapping: notImplementedHandler<'listModelCompatibilityMapping'>(),
    listApiKeys: notImplementedHandler<'listApiKeys'>(),
    createApiKey: notImplementedHandler<'createApiKey'>(),
    updateApiKey: notImplementedHandler<'updateApiKey'>(),
    deleteApiKey: notImplementedHandler<'deleteApiKey'>(),
    getApiKey: notImplementedHandler<'getApiKey'>(),
    getApiKeyRateLimits: notImplementedHandler<'getApiKeyRateLimits'>(),
    listApiKeyRateLimitLogs: notImplementedHandler<'listApiKeyRateLimitLogs'>(),
    getBillingBalance: notImplementedHandler<'getBillingBalance'>(),
    getBillingUsageHistory: notImplementedHandler<'getBillingUsageHistory'>(),
    getBillingUsageAnalytics: notImplementedHandler<'getBillingUsageAnalytics'>(),
    callCryptoRpc: notImplementedHandler<'callCryptoRpc'>(),
    listCryptoRpcNetworks: notImplementedHandler<'listCryptoRpcNetworks'>(),
    getX402Balance: notImplementedHandler<'getX402Balance'>(),
    listX402Transactions: notImplementedHandler<'listX402Transactions'>(),
    topUpX402Balance: notImplementedHandler<'topUpX402Balance'>(),
  } satisfies HandlerTable;
  return { ...table, ...groups } as HandlerTable;
}
