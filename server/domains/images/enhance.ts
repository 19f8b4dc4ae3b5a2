/**
 * `enhance_prompt`: the service's own deterministic prompt rewrite. It tidies the prompt (collapsed
 * whitespace, a capital first letter, no trailing punctuation) and adds, in this order, what a good image
 * prompt names and this one does not: the lighting, the level of detail, the composition. Each addition is
 * made only when the prompt has no word of its kind and when it still fits the model's prompt limit.
 *
 * The result is `undefined` when nothing changed (the prompt already names all three, or no addition fits):
 * then no rewrite was made, so nothing is charged and no `x-service-enhanced-prompt` header is sent.
 */

const ADDITIONS: { words: RegExp; text: string }[] = [
  {
    words:
      /\b(light|lights|lighting|lit|glow|glowing|sunlight|moonlight|sunrise|sunset|dawn|dusk|twilight|night|backlit|illuminated|shadows?)\b/i,
    text: 'soft natural lighting',
  },
  {
    words: /\b(detail|detailed|details|intricate|sharp|hd|4k|8k|high resolution|hi-res|ultra)\b/i,
    text: 'highly detailed',
  },
  {
    words:
      /\b(composition|composed|wide|close-up|closeup|portrait|landscape|panorama|panoramic|shot|view|angle|framing|framed|isometric)\b/i,
    text: 'balanced composition',
  },
];

export function enhancePrompt(prompt: string, characterLimit: number): string | undefined {
  const tidy = prompt
    .replace(/\s+/g, ' ')
    .trim()
    .replace(/[\s,.;:]+$/, '');
  let result = tidy.charAt(0).toUpperCase() + tidy.slice(1);
  for (const addition of ADDITIONS) {
    if (addition.words.test(result)) continue;
    const candidate = `${result}, ${addition.text}`;
    if (candidate.length <= characterLimit) result = candidate;
  }
  return result === prompt ? undefined : result;
}
