/**
 * Form fields arrive as text: before the validator checks a multipart body, the fields that the operation's
 * schema declares boolean, integer or number are read as such (`"true"` becomes `true`, `"12"` becomes 12);
 * anything else is left as sent, so the validator still refuses what does not parse. JSON bodies are untouched.
 */
import type { NextFunction, Request, Response } from 'express';
import { resolveLocalRef } from '../../http/spec.ts';

type Schema = { $ref?: string; type?: string | string[]; properties?: Record<string, Schema> };

function resolve(document: unknown, schema: Schema | undefined): Schema | undefined {
  if (!schema?.$ref?.startsWith('#/')) return schema;
  return resolveLocalRef(document, schema.$ref) as Schema | undefined;
}

function coerce(value: string, type: string | string[] | undefined): unknown {
  const types = Array.isArray(type) ? type : [type];
  if (types.includes('boolean') && (value === 'true' || value === 'false')) return value === 'true';
  if ((types.includes('integer') || types.includes('number')) && /^-?\d+(\.\d+)?$/.test(value))
    return Number(value);
  return value;
}

export function coerceMultipartFields(document: unknown) {
  return (req: Request, _res: Response, next: NextFunction) => {
    const operation = (req as Request & { openapi?: { schema?: { requestBody?: unknown } } }).openapi?.schema;
    const content = (operation?.requestBody as { content?: Record<string, { schema?: Schema }> } | undefined)
      ?.content?.['multipart/form-data'];
    const body = req.body as Record<string, unknown> | undefined;
    if (content && body && typeof body === 'object' && req.is('multipart/form-data')) {
      const properties = resolve(document, content.schema)?.properties ?? {};
      for (const [name, value] of Object.entries(body)) {
        const type = resolve(document, properties[name])?.type;
        if (typeof value === 'string' && type) body[name] = coerce(value, type);
      }
    }
    next();
  };
}
