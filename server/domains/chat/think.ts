/**
 * Removal of `<think>…</think>` blocks (the older reasoning format) from an answer, whole or as it streams:
 * the streaming form holds back anything that could be the start of a tag until the next piece decides it.
 */
const OPEN = '<think>';
const CLOSE = '</think>';

/** Removes every think block and the blank space that follows it. */
export function stripThinkBlocks(text: string): string {
  const stripper = createThinkStripper();
  return stripper.push(text) + stripper.flush();
}

/** Longest suffix of `text` that is a proper prefix of `tag`. */
function partialTag(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--)
    if (text.endsWith(tag.slice(0, n))) return n;
  return 0;
}

export type ThinkStripper = { push(text: string): string; flush(): string };

export function createThinkStripper(): ThinkStripper {
  let buffer = '';
  let inside = false;
  let trimLeading = false;
  const emit = (text: string) => {
    if (!trimLeading) return text;
    const trimmed = text.replace(/^\s+/, '');
    if (trimmed) trimLeading = false;
    return trimmed;
  };
  return {
    push(text) {
      buffer += text;
      let out = '';
      for (;;) {
        if (!inside) {
          const at = buffer.indexOf(OPEN);
          if (at >= 0) {
            out += emit(buffer.slice(0, at));
            buffer = buffer.slice(at + OPEN.length);
            inside = true;
            continue;
          }
          const keep = partialTag(buffer, OPEN);
          out += emit(buffer.slice(0, buffer.length - keep));
          buffer = buffer.slice(buffer.length - keep);
          return out;
        }
        const at = buffer.indexOf(CLOSE);
        if (at >= 0) {
          buffer = buffer.slice(at + CLOSE.length);
          inside = false;
          trimLeading = true;
          continue;
        }
        const keep = partialTag(buffer, CLOSE);
        buffer = buffer.slice(buffer.length - keep);
        return out;
      }
    },
    flush() {
      const rest = inside ? '' : emit(buffer);
      buffer = '';
      return rest;
    },
  };
}
