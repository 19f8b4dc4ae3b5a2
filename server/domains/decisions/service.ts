/**
 * Decisions: a state and questions of three kinds (`noul`, `choice`, `score`) answered through a chat provider
 * (the embedded local engine or an OpenAI-compatible upstream, whichever the decision model's backend is).
 *
 * The provider is asked to call one function whose arguments give, for every question, a non-negative weight
 * per option (`true`/`false` for a noul, the option names for a choice, the level indexes for a score). The
 * service validates that shape strictly (an upstream is never trusted), normalises the weights into
 * probabilities and derives the answers: the noul is P(true); a choice or score is the most likely option with
 * its probability as the confidence. The sampling seed is derived from the request, so the same request gets
 * the same answers from the local engine.
 *
 * Billing is chat's: the worst case (every prompt token, the output bound) is reserved, the real token usage is
 * captured as CHARGE entries with the request and model ids, the rest is released; a failure releases it all.
 */
import { createHash } from 'node:crypto';
import { z } from 'zod';
import type { DecisionAnswer, DecisionRequest, DecisionResponse } from '../../../generated/api.d.ts';
import type { CatalogService } from '../../catalog/service.ts';
import type { Backend, CatalogModel } from '../../catalog/types.ts';
import type { Principal } from '../../http/auth.ts';
import { ApiError, badRequest, notFound } from '../../http/errors.ts';
import { countPromptTokens, countTokens } from '../../providers/chat/tokenizer.ts';
import type {
  ChatProvider,
  ChatProviderRequest,
  ProviderMessage,
  ProviderTool,
  ProviderUsage,
} from '../../providers/chat/types.ts';
import type { CaptureItem } from '../../storage/ledger.ts';
import type { Charges } from '../billing/charges.ts';
import { tokenPrices } from '../chat/pricing.ts';
import { MESSAGES, toApiError } from '../chat/service.ts';

export type DecisionServiceDeps = {
  catalog: CatalogService;
  charges: Charges;
  isPro(accountId: string): Promise<boolean>;
  /** The chat provider serving one backend of the decision model. */
  providerFor(backend: Backend): ChatProvider;
};

export type DecisionService = ReturnType<typeof createDecisionService>;

/** Output bound of one call: the weights of 32 questions fit well within it. */
export const DECISION_MAX_OUTPUT_TOKENS = 4096;
export const ANSWER_TOOL = 'answer_questions';

type Question = DecisionRequest['questions'][string];

const MILLION = 1_000_000n;
const ceilDiv = (a: bigint, b: bigint) => (a + b - 1n) / b;

/** The option keys a question's answer weighs, in the question's order. */
export function optionsOf(question: Question): string[] {
  switch (question.type) {
    case 'noul':
      return ['true', 'false'];
    case 'choice':
      return Object.keys(question.criteria);
    case 'score':
      return question.criteria.map((_, index) => String(index));
  }
}

const text = (value: unknown) => (typeof value === 'string' ? value : JSON.stringify(value));

function describeQuestion(id: string, question: Question): string {
  const lines = [`Question "${id}" (${question.type}): ${text(question.instructions)}`];
  if (question.type === 'noul') {
    if (question.criteria?.true) lines.push(`  true when: ${question.criteria.true}`);
    if (question.criteria?.false) lines.push(`  false when: ${question.criteria.false}`);
  } else if (question.type === 'choice') {
    for (const [option, description] of Object.entries(question.criteria))
      lines.push(`  option "${option}"${description ? `: ${description}` : ''}`);
  } else {
    question.criteria.forEach((level, index) => {
      lines.push(`  level ${index}: ${level}`);
    });
  }
  return lines.join('\n');
}

/** The function the provider must call: per question, a non-negative weight per option. */
export function answerTool(questions: DecisionRequest['questions']): ProviderTool {
  const properties = Object.fromEntries(
    Object.entries(questions).map(([id, question]) => {
      const options = optionsOf(question);
      return [
        id,
        {
          type: 'object',
          description: 'Relative likelihood (a non-negative weight) of each option',
          properties: Object.fromEntries(options.map((o) => [o, { type: 'number', minimum: 0 }])),
          required: options,
          additionalProperties: false,
        },
      ];
    }),
  );
  return {
    type: 'function',
    function: {
      name: ANSWER_TOOL,
      description: 'Gives the weight of every option of every question about the state.',
      parameters: {
        type: 'object',
        properties,
        required: Object.keys(questions),
        additionalProperties: false,
      },
    },
  };
}

export function decisionMessages(body: DecisionRequest): ProviderMessage[] {
  return [
    {
      role: 'system',
      content:
        `You judge a state against questions. Call ${ANSWER_TOOL} once. For every question give each option a ` +
        'non-negative weight proportional to how likely it is: for a yes/no question the options are "true" and ' +
        '"false", for a choice the option names, for a score the level numbers.',
    },
    {
      role: 'user',
      content: `State:\n${text(body.state)}\n\n${Object.entries(body.questions)
        .map(([id, q]) => describeQuestion(id, q))
        .join('\n\n')}`,
    },
  ];
}

/** Validates the provider's arguments and turns the weights into the contract's answers. */
export function answersFrom(
  questions: DecisionRequest['questions'],
  argumentsJson: string,
): Record<string, DecisionAnswer> {
  let raw: unknown;
  try {
    raw = JSON.parse(argumentsJson);
  } catch (cause) {
    throw new ApiError(500, MESSAGES.failed, { code: 'INFERENCE_FAILED', cause });
  }
  const weight = z.number().finite().min(0);
  const shape = z.object(
    Object.fromEntries(
      Object.entries(questions).map(([id, q]) => [
        id,
        z.object(Object.fromEntries(optionsOf(q).map((o) => [o, weight]))),
      ]),
    ),
  );
  const parsed = shape.safeParse(raw);
  if (!parsed.success) {
    throw new ApiError(500, MESSAGES.failed, { code: 'INFERENCE_FAILED', cause: parsed.error });
  }
  const round = (p: number) => Math.round(p * 10_000) / 10_000;
  const answers: Record<string, DecisionAnswer> = {};
  for (const [id, question] of Object.entries(questions)) {
    const options = optionsOf(question);
    const weights = parsed.data[id] as Record<string, number>;
    const total = options.reduce((sum, o) => sum + (weights[o] ?? 0), 0);
    const probabilities = Object.fromEntries(
      options.map((o) => [o, round(total > 0 ? (weights[o] ?? 0) / total : 1 / options.length)]),
    );
    let best = options[0] ?? '';
    for (const o of options) if ((probabilities[o] ?? 0) > (probabilities[best] ?? 0)) best = o;
    const confidence = probabilities[best] ?? 0;
    if (question.type === 'noul') {
      answers[id] = { type: 'noul', noul: probabilities.true ?? 0 };
    } else if (question.type === 'choice') {
      answers[id] = { type: 'choice', choice: best, probabilities, confidence };
    } else {
      answers[id] = {
        type: 'score',
        score: Number(best),
        legend: Object.fromEntries(question.criteria.map((level, index) => [String(index), level])),
        probabilities,
        confidence,
      };
    }
  }
  return answers;
}

function chargeItems(model: CatalogModel, usage: ProviderUsage): CaptureItem[] {
  const prices = tokenPrices(model, usage.promptTokens);
  const items: CaptureItem[] = [];
  const line = (sku: string, units: number, price: bigint): CaptureItem => ({
    sku,
    units: (units / 1e6).toString(),
    unitPriceNano: price,
    amountNano: ceilDiv(BigInt(units) * price, MILLION),
  });
  if (usage.promptTokens > 0) items.push(line('decision.input_tokens', usage.promptTokens, prices.input));
  if (usage.completionTokens > 0)
    items.push(line('decision.output_tokens', usage.completionTokens, prices.output));
  return items;
}

export function createDecisionService(deps: DecisionServiceDeps) {
  return {
    async decide(input: {
      body: DecisionRequest;
      principal: Principal;
      requestId: string;
      signal?: AbortSignal;
    }): Promise<{ response: DecisionResponse; model: CatalogModel; router: string }> {
      const { body, principal } = input;
      const resolved = deps.catalog.resolveModel(body.model, 'decision');
      if (!resolved) throw notFound(`Model ${body.model.split(':')[0]} was not found`, 'MODEL_NOT_FOUND');
      const model = resolved.model;
      if (model.pro && !(await deps.isPro(principal.accountId)))
        throw new ApiError(401, MESSAGES.proOnly, { code: 'PRO_ONLY_MODEL' });
      const backend = model.backends[0];
      if (!backend) throw new ApiError(503, MESSAGES.capacity, { code: 'MODEL_AT_CAPACITY' });

      const constraints = (model.spec.constraints ?? {}) as {
        maxStateTokens?: number;
        maxTotalTokens?: number;
      };
      const stateTokens = countTokens(text(body.state));
      if (constraints.maxStateTokens !== undefined && stateTokens > constraints.maxStateTokens) {
        throw badRequest(
          `The state is ${stateTokens} tokens; model ${model.id} reads at most ${constraints.maxStateTokens}`,
          'TOO_MANY_TOKENS',
        );
      }
      const messages = decisionMessages(body);
      const tool = answerTool(body.questions);
      const promptTokens = countPromptTokens(messages, [tool]);
      const maxTotal = constraints.maxTotalTokens ?? Number.MAX_SAFE_INTEGER;
      const maxTokens = Math.min(DECISION_MAX_OUTPUT_TOKENS, maxTotal - promptTokens);
      if (maxTokens < 64) {
        throw badRequest(
          `The request is ${promptTokens} tokens; model ${model.id} handles at most ${maxTotal} in total`,
          'TOO_MANY_TOKENS',
        );
      }

      // An upstream counts the prompt with its own tokenizer and may add its own system prompt: the input part
      // of the reservation leaves room for that (a capture never exceeds the reservation).
      const inputBound = Math.min(maxTotal, promptTokens * 2 + 1024);
      const prices = tokenPrices(model, inputBound);
      const reservation = await deps.charges.reserve(principal, {
        amountNano:
          ceilDiv(BigInt(inputBound) * prices.input, MILLION) +
          ceilDiv(BigInt(maxTokens) * prices.output, MILLION),
        requestId: input.requestId,
        modelId: model.id,
      });
      const seed = createHash('sha256')
        .update(JSON.stringify([body.state, body.questions]))
        .digest()
        .readUInt32BE(0);
      const request: ChatProviderRequest = {
        model: backend.kind === 'local' ? model.id : backend.upstreamModel,
        messages,
        maxTokens,
        n: 1,
        sampling: { temperature: 0, seed },
        tools: [tool],
        toolChoice: { type: 'function', function: { name: ANSWER_TOOL } },
        ...(input.signal ? { signal: input.signal } : {}),
      };
      const provider = deps.providerFor(backend);
      let argumentsJson = '';
      let usage: ProviderUsage | undefined;
      try {
        for await (const event of provider.stream(request)) {
          if (event.type === 'delta') {
            for (const call of event.toolCalls ?? []) argumentsJson += call.function?.arguments ?? '';
          } else if (event.type === 'usage') {
            usage = event.usage;
          }
        }
        const answers = answersFrom(body.questions, argumentsJson);
        const used = usage ?? {
          promptTokens,
          completionTokens: countTokens(argumentsJson),
          reasoningTokens: 0,
          cachedTokens: 0,
          cacheCreationTokens: 0,
        };
        await deps.charges.capture(
          reservation,
          chargeItems(model, used).map((item) => ({ ...item, modelId: model.id })),
        );
        return {
          response: {
            model: model.id,
            answers,
            usage: { input_tokens: used.promptTokens, output_tokens: used.completionTokens },
          },
          model,
          router: provider.name,
        };
      } catch (error) {
        await deps.charges.release(reservation);
        throw toApiError(error);
      }
    },
  };
}
