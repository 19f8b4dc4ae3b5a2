/**
 * The content check of image prompts: deterministic word matching, documented here so that clients can
 * predict it. It is a policy floor, not a classifier of pixels.
 *
 * - **Adult content**: the prompt (not the negative prompt) contains one of `ADULT_TERMS` as a whole word
 *   (case-insensitive; a trailing `s` also matches). With `safe_mode` on, such images are blurred and
 *   `x-service-is-blurred: true` is sent; with `safe_mode` off they are returned as drawn.
 * - **Content policy violation**: adult content together with one of `MINOR_TERMS`. The request is refused
 *   with 422 `CONTENT_POLICY_VIOLATION` before anything is generated or charged.
 */

export const ADULT_TERMS = [
  'nsfw',
  'nude',
  'nudity',
  'naked',
  'topless',
  'bottomless',
  'porn',
  'porno',
  'pornographic',
  'explicit',
  'erotic',
  'erotica',
  'sex',
  'sexual',
  'sexy',
  'hentai',
  'lingerie',
  'fetish',
  'xxx',
] as const;

export const MINOR_TERMS = [
  'child',
  'children',
  'kid',
  'kids',
  'minor',
  'minors',
  'underage',
  'teen',
  'teenager',
  'boy',
  'girl',
  'schoolgirl',
  'schoolboy',
  'toddler',
  'baby',
] as const;

const adult = new Set<string>(ADULT_TERMS);
const minor = new Set<string>(MINOR_TERMS);

export type ContentCheck = {
  /** Adult terms found (lower case, in prompt order). */
  adultTerms: string[];
  adult: boolean;
  /** Adult content that involves minors: refused. */
  violation: boolean;
};

function matches(set: Set<string>, word: string): boolean {
  return set.has(word) || (word.endsWith('s') && set.has(word.slice(0, -1)));
}

export function checkPromptContent(prompt: string): ContentCheck {
  const words = prompt.toLowerCase().match(/[a-z]+/g) ?? [];
  const adultTerms = words.filter((w) => matches(adult, w));
  const isAdult = adultTerms.length > 0;
  return {
    adultTerms,
    adult: isAdult,
    violation: isAdult && words.some((w) => matches(minor, w)),
  };
}
