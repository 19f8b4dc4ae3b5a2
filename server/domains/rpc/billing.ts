/**
 * Pricing of JSON-RPC calls: the plan of a request (each item's method checked and priced before anything is
 * sent) and the bill of an answer (each request item paired by `id` with its response item: a result costs
 * its tier price, an `error` 5 credits, an item the node left unanswered nothing).
 */
import { badRequest } from '../../http/errors.ts';
import { classifyMethod, type RefusalReason, refusalText } from './methods.ts';
import type { RpcNetwork } from './networks.ts';

/** Credits of an item the node answered with a JSON-RPC `error`. */
export const ERROR_ITEM_CREDITS = 5;

type RequestItem = { method: string; id?: unknown };

export type RpcPlan = {
  batch: boolean;
  /** The `id` of each item, as a comparable key. */
  ids: string[];
  /** Tier price of each item, in credits. */
  credits: number[];
  /** The most the request can cost: every item at max(tier price, error price). */
  worstCase: number;
};

const idKey = (id: unknown) => (typeof id === 'string' ? `s${id}` : `n${String(id ?? null)}`);

/** Checks and prices every item; throws 400 naming each refused method when any is refused. */
export function planRequest(network: RpcNetwork, body: unknown): RpcPlan {
  const batch = Array.isArray(body);
  const items = (batch ? body : [body]) as RequestItem[];
  const ids: string[] = [];
  const credits: number[] = [];
  let worstCase = 0;
  let refused: Array<[method: string, reason: RefusalReason]> | undefined;
  for (const item of items) {
    const cls = classifyMethod(network.family, item.method);
    if (!cls.allowed) {
      refused ??= [];
      if (!refused.some(([m]) => m === item.method)) refused.push([item.method, cls.reason]);
      continue;
    }
    const price = network.baseCredits * cls.tier;
    ids.push(idKey(item.id));
    credits.push(price);
    worstCase += Math.max(price, ERROR_ITEM_CREDITS);
  }
  if (refused) {
    const list = refused.map(([method, reason]) => `${method} (${refusalText(reason)})`).join('; ');
    throw badRequest(
      `Unsupported method${refused.length > 1 ? 's' : ''} on ${network.slug}: ${list}. ${
        batch ? 'The whole batch was rejected; nothing was sent or charged.' : 'Nothing was sent or charged.'
      }`,
      'UNSUPPORTED_METHOD',
    );
  }
  return { batch, ids, credits, worstCase };
}

type ResponseItem = { id?: unknown; error?: unknown; result?: unknown };

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

const isResponseItem = (value: unknown): value is ResponseItem =>
  isObject(value) && ('result' in value || isObject(value.error));

/**
 * Parses the node's answer and prices it against the plan; undefined when it is not a JSON-RPC answer (the
 * upstream then tries its next node).
 */
export function billAnswer(plan: RpcPlan, body: Buffer): number | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(body.toString('utf8'));
  } catch {
    return undefined;
  }
  if (!plan.batch || !Array.isArray(parsed)) {
    if (!isResponseItem(parsed)) return undefined;
    // A batch answered with one error object (the node refused the batch as a whole) is one error item.
    if (plan.batch) return isObject(parsed.error) ? ERROR_ITEM_CREDITS : undefined;
    return isObject(parsed.error) ? ERROR_ITEM_CREDITS : (plan.credits[0] ?? 0);
  }
  const answers = new Map<string, ResponseItem[]>();
  for (const item of parsed) {
    if (!isResponseItem(item)) return undefined;
    const key = idKey(item.id);
    const queue = answers.get(key);
    if (queue) queue.push(item);
    else answers.set(key, [item]);
  }
  let total = 0;
  for (let i = 0; i < plan.ids.length; i++) {
    const answer = answers.get(plan.ids[i] as string)?.shift();
    if (!answer) continue;
    total += isObject(answer.error) ? ERROR_ITEM_CREDITS : (plan.credits[i] ?? 0);
  }
  return total;
}
