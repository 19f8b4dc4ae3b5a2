/**
 * A bound on the nesting depth of parsed JSON bodies. V8's JSON.parse accepts any depth, but much of what
 * runs after it recurses (the request validator, JSON.stringify for token counts, upstream serialisation):
 * 100k levels of `[[[…]]]` would overflow the stack there and become a 500. Refusing such bodies right after
 * parsing turns them into a clear 400.
 */
import type { NextFunction, Request, Response } from 'express';
import { ApiError } from './errors.ts';

/** Deepest nesting accepted (objects and arrays); legitimate requests stay far below it. */
export const MAX_JSON_DEPTH = 128;

/** True when `value` nests objects or arrays deeper than `limit` levels. Iterative: any depth is safe. */
export function exceedsDepth(value: unknown, limit: number = MAX_JSON_DEPTH): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [node, depth] = stack.pop() as [unknown, number];
    if (node === null || typeof node !== 'object') continue;
    if (depth > limit) return true;
    for (const child of Array.isArray(node) ? node : Object.values(node)) {
      if (child !== null && typeof child === 'object') stack.push([child, depth + 1]);
    }
  }
  return false;
}

/** Express middleware: a parsed body nested deeper than MAX_JSON_DEPTH is a 400 `INVALID_JSON`. */
export function limitJsonDepth(req: Request, _res: Response, next: NextFunction): void {
  if (exceedsDepth(req.body)) {
    next(
      new ApiError(400, `JSON request body nests deeper than ${MAX_JSON_DEPTH} levels`, {
        code: 'INVALID_JSON',
      }),
    );
    return;
  }
  next();
}
