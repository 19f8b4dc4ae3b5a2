/**
 * The effective service options of a chat request: `service_parameters` from the body over the model-id
 * suffix (`<model>:<option>=<value>&…`) over the defaults, checked against what the model supports. The
 * result is what the response echoes in `service_parameters`.
 */
import type { ChatServiceParameters, ChatServiceParametersEcho } from '../../../generated/api.d.ts';
import type { CatalogModel } from '../../catalog/types.ts';
import { badRequest } from '../../http/errors.ts';

export type WebSearchMode = 'off' | 'on' | 'auto';

export type ChatOptions = {
  character_slug?: string;
  enable_web_search: WebSearchMode;
  strip_thinking_response: boolean;
  disable_thinking: boolean;
  enable_web_scraping: boolean;
  enable_x_search: boolean;
  enable_web_citations: boolean;
  include_search_results_in_stream: boolean;
  return_search_results_as_documents: boolean;
  include_service_system_prompt: boolean;
  enable_e2ee: boolean;
};

const BOOLEAN_OPTIONS = [
  'strip_thinking_response',
  'disable_thinking',
  'enable_web_scraping',
  'enable_x_search',
  'enable_web_citations',
  'include_search_results_in_stream',
  'return_search_results_as_documents',
  'include_service_system_prompt',
  'enable_e2ee',
] as const;

type BooleanOption = (typeof BOOLEAN_OPTIONS)[number];

const invalid = (field: string, message: string) =>
  badRequest(message, 'INVALID_REQUEST', {
    _errors: [],
    model: { _errors: [`${field}: ${message}`] },
  });

/** Options of the model-id suffix, typed; unknown options and bad values are a 400 that names them. */
function parseSuffix(suffix: Record<string, string>): Partial<ChatOptions> {
  const out: Partial<ChatOptions> = {};
  for (const [key, raw] of Object.entries(suffix)) {
    const value = raw.trim();
    if (key === 'character_slug') {
      if (!value) throw invalid(key, 'character_slug needs a value');
      out.character_slug = value;
    } else if (key === 'enable_web_search') {
      if (value !== 'off' && value !== 'on' && value !== 'auto')
        throw invalid(key, `enable_web_search must be off, on or auto (got '${raw}')`);
      out.enable_web_search = value;
    } else if ((BOOLEAN_OPTIONS as readonly string[]).includes(key)) {
      const lower = value.toLowerCase();
      if (lower !== 'true' && lower !== 'false')
        throw invalid(key, `${key} must be true or false (got '${raw}')`);
      out[key as BooleanOption] = lower === 'true';
    } else {
      throw invalid(key, `Unknown model option '${key}' in the model suffix`);
    }
  }
  return out;
}

/** Merges body over suffix over defaults, and refuses options the model cannot honour. */
export function resolveOptions(
  model: CatalogModel,
  body: ChatServiceParameters | undefined,
  suffix: Record<string, string>,
): ChatOptions {
  const given: Partial<ChatOptions> = { ...parseSuffix(suffix) };
  for (const [key, value] of Object.entries(body ?? {})) {
    if (value !== undefined) (given as Record<string, unknown>)[key] = value;
  }
  const caps: Partial<NonNullable<CatalogModel['spec']['capabilities']>> = model.spec.capabilities ?? {};
  const options: ChatOptions = {
    enable_web_search: given.enable_web_search ?? 'off',
    strip_thinking_response: given.strip_thinking_response ?? false,
    disable_thinking: given.disable_thinking ?? false,
    enable_web_scraping: given.enable_web_scraping ?? false,
    enable_x_search: given.enable_x_search ?? false,
    enable_web_citations: given.enable_web_citations ?? false,
    include_search_results_in_stream: given.include_search_results_in_stream ?? false,
    return_search_results_as_documents: given.return_search_results_as_documents ?? false,
    include_service_system_prompt: given.include_service_system_prompt ?? true,
    enable_e2ee: given.enable_e2ee ?? caps.supportsE2EE === true,
    ...(given.character_slug ? { character_slug: given.character_slug } : {}),
  };
  if (options.enable_e2ee && caps.supportsE2EE !== true)
    throw badRequest(
      `Model ${model.id} does not support end-to-end encryption (enable_e2ee)`,
      'UNSUPPORTED_FEATURE',
    );
  if (options.enable_x_search && caps.supportsXSearch !== true)
    throw badRequest(`Model ${model.id} does not support X search (enable_x_search)`, 'UNSUPPORTED_FEATURE');
  if (options.enable_web_search === 'on' && caps.supportsWebSearch !== true)
    throw badRequest(
      `Model ${model.id} does not support web search (enable_web_search)`,
      'UNSUPPORTED_FEATURE',
    );
  if (options.enable_web_search === 'auto' && caps.supportsWebSearch !== true)
    options.enable_web_search = 'off';
  return options;
}

/** The response's `service_parameters` echo. */
export function echoOptions(
  options: ChatOptions,
  citations?: ChatServiceParametersEcho['web_search_citations'],
): ChatServiceParametersEcho {
  return {
    enable_e2ee: options.enable_e2ee,
    enable_web_search: options.enable_web_search,
    enable_web_citations: options.enable_web_citations,
    enable_web_scraping: options.enable_web_scraping,
    include_service_system_prompt: options.include_service_system_prompt,
    include_search_results_in_stream: options.include_search_results_in_stream,
    return_search_results_as_documents: options.return_search_results_as_documents,
    strip_thinking_response: options.strip_thinking_response,
    disable_thinking: options.disable_thinking,
    ...(options.character_slug ? { character_slug: options.character_slug } : {}),
    ...(citations ? { web_search_citations: citations } : {}),
  };
}
