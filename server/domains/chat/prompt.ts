/**
 * From the request's messages to what a provider receives: the service's default system prompt and the
 * persona's instructions first, then the caller's messages; content parts checked against the model's
 * capabilities (images need vision, audio and video their input support) and file parts converted to text.
 */
import type { ChatCompletionRequest } from '../../../generated/api.d.ts';
import type { CatalogModel } from '../../catalog/types.ts';
import { badRequest } from '../../http/errors.ts';
import type { ProviderContentPart, ProviderMessage } from '../../providers/chat/types.ts';

/** The service's default system prompt (kept unless `include_service_system_prompt` is false). */
export const DEFAULT_SYSTEM_PROMPT =
  'You are a helpful assistant. Answer accurately and concisely, say so when you are not sure, and follow ' +
  "the user's instructions about format and length.";

/** Converts an attached file to text (PDF, DOCX, PPTX, XLSX, TXT…); throws a 400-worthy error otherwise. */
export type FileConverter = (input: { filename?: string; fileData: string }) => Promise<string>;

/** Files per message, as the interface's peers cap them. */
const MAX_FILES_PER_MESSAGE = 5;

type RequestMessage = ChatCompletionRequest['messages'][number];
type Loose = Record<string, unknown>;

const PASS_BACK = ['reasoning_content', 'reasoning_details', 'thought_signature'];

export async function buildMessages(input: {
  model: CatalogModel;
  messages: RequestMessage[];
  includeServicePrompt: boolean;
  personaPrompt?: string;
  convertFile?: FileConverter;
}): Promise<ProviderMessage[]> {
  const caps: Loose = (input.model.spec.capabilities ?? {}) as Loose;
  const out: ProviderMessage[] = [];
  if (input.includeServicePrompt) out.push({ role: 'system', content: DEFAULT_SYSTEM_PROMPT });
  if (input.personaPrompt) out.push({ role: 'system', content: input.personaPrompt });
  let images = 0;
  for (const [i, raw] of input.messages.entries()) {
    const message = raw as Loose;
    const role = message.role as ProviderMessage['role'];
    const next: ProviderMessage = { role, content: null };
    if (typeof message.name === 'string') next.name = message.name;
    if (Array.isArray(message.content)) {
      const parts: ProviderContentPart[] = [];
      let files = 0;
      for (const [j, p] of (message.content as Loose[]).entries()) {
        const where = `messages[${i}].content[${j}]`;
        switch (p.type) {
          case 'text':
            parts.push(p as ProviderContentPart);
            break;
          case 'image_url':
            if (caps.supportsVision !== true)
              throw badRequest(
                `${where}: model ${input.model.id} does not accept images`,
                'UNSUPPORTED_FEATURE',
              );
            images++;
            parts.push(p as ProviderContentPart);
            break;
          case 'input_audio':
            if (caps.supportsAudioInput !== true)
              throw badRequest(
                `${where}: model ${input.model.id} does not accept audio input`,
                'UNSUPPORTED_FEATURE',
              );
            parts.push(p as ProviderContentPart);
            break;
          case 'video_url':
            if (caps.supportsVideoInput !== true)
              throw badRequest(
                `${where}: model ${input.model.id} does not accept video input`,
                'UNSUPPORTED_FEATURE',
              );
            parts.push(p as ProviderContentPart);
            break;
          case 'file': {
            if (!input.convertFile)
              throw badRequest(`${where}: file parts are not supported`, 'UNSUPPORTED_FEATURE');
            const file = p.file as { file_data: string; filename?: string };
            files++;
            if (files > MAX_FILES_PER_MESSAGE)
              throw badRequest(
                `messages[${i}]: at most ${MAX_FILES_PER_MESSAGE} files per message`,
                'UNSUPPORTED_FEATURE',
              );
            const text = await input.convertFile({
              fileData: file.file_data,
              ...(file.filename ? { filename: file.filename } : {}),
            });
            parts.push({
              type: 'text',
              text: `Attached file${file.filename ? ` ${file.filename}` : ''}:\n${text}`,
              ...(p.cache_control ? { cache_control: p.cache_control as { type: 'ephemeral' } } : {}),
            });
            break;
          }
          default:
            throw badRequest(`${where}: unknown content part type`);
        }
      }
      next.content = parts;
    } else if (typeof message.content === 'string') {
      next.content = message.content;
    }
    if (Array.isArray(message.tool_calls) && message.tool_calls.length > 0)
      next.tool_calls = message.tool_calls as ProviderMessage['tool_calls'];
    if (typeof message.tool_call_id === 'string') next.tool_call_id = message.tool_call_id;
    if (role === 'assistant') {
      const extra = Object.fromEntries(
        PASS_BACK.filter((k) => message[k] != null).map((k) => [k, message[k]]),
      );
      if (Object.keys(extra).length > 0) next.extra = extra;
    }
    out.push(next);
  }
  const maxImages = caps.supportsMultipleImages === true ? Number(caps.maxImages ?? 10) : 1;
  if (images > maxImages)
    throw badRequest(
      `Model ${input.model.id} accepts at most ${maxImages} image(s) per request`,
      'UNSUPPORTED_FEATURE',
    );
  return out;
}
