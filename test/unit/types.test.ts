/**
 * The generated types are usable as the contract: these values must type-check (`npm run typecheck`), and
 * the assertions keep them honest at run time.
 */
import { describe, expect, expectTypeOf, test } from 'vitest';
import type {
  ChatCompletion,
  ChatCompletionRequest,
  DetailedError,
  ImageGenerateRequest,
  operations,
  paths,
} from '../../generated/api.d.ts';

describe('generated types', () => {
  test('behavior: the recursive validation details tree is constructible', () => {
    const body: DetailedError = {
      error: 'request/body/messages/0/role must be one of the allowed values',
      details: { _errors: [], messages: { _errors: [], 0: { _errors: [], role: { _errors: ['invalid'] } } } },
    };
    expect(body.details._errors).toEqual([]);
  });

  test('behavior: request fields that have defaults stay optional', () => {
    const chat: ChatCompletionRequest = {
      model: 'llama-3.3-70b',
      messages: [{ role: 'user', content: 'hi' }],
    };
    const image: ImageGenerateRequest = { model: 'z-image-turbo', prompt: 'a lighthouse' };
    expectTypeOf<ChatCompletionRequest['stream']>().toEqualTypeOf<boolean | undefined>();
    expect(chat.stream ?? false).toBe(false);
    expect(image.return_binary ?? false).toBe(false);
  });

  test('behavior: operations and paths are keyed by operationId and path', () => {
    expectTypeOf<
      operations['createChatCompletion']['responses'][200]['content']['application/json']
    >().toEqualTypeOf<ChatCompletion>();
    expectTypeOf<paths['/models']['get']>().toEqualTypeOf<operations['listModels']>();
    const finish: ChatCompletion['choices'] = [];
    expect(finish).toEqual([]);
  });
});
