/**
 * Content negotiation for operations that offer several media types (e.g. JSON or CSV): the caller's `Accept`
 * with its q-values decides; on a tie the server's order wins. `Accept: application/json, text/csv` is JSON;
 * `Accept: text/csv` (or `text/csv, application/json;q=0.5`) is CSV; no `Accept` is the first offered type.
 */
type Range = { type: string; subtype: string; q: number };

function parseAccept(header: string): Range[] {
  const ranges: Range[] = [];
  for (const part of header.split(',')) {
    const [mediaRange = '', ...params] = part.trim().split(';');
    const [type, subtype] = mediaRange.trim().toLowerCase().split('/');
    if (!type || !subtype) continue;
    let q = 1;
    for (const param of params) {
      const [name, value] = param.trim().split('=');
      if (name?.trim().toLowerCase() === 'q') {
        const parsed = Number(value);
        q = Number.isFinite(parsed) ? Math.min(1, Math.max(0, parsed)) : 0;
      }
    }
    ranges.push({ type, subtype, q });
  }
  return ranges;
}

/** The q-value the caller gives a media type: the most specific matching range decides. */
function qualityOf(ranges: Range[], mediaType: string): number {
  const [type, subtype] = mediaType.toLowerCase().split('/');
  let best = { specificity: -1, q: 0 };
  for (const range of ranges) {
    const specificity =
      range.type === type && range.subtype === subtype
        ? 2
        : range.type === type && range.subtype === '*'
          ? 1
          : range.type === '*' && range.subtype === '*'
            ? 0
            : -1;
    if (specificity > best.specificity) best = { specificity, q: range.q };
  }
  return best.q;
}

/** The offered media type the caller prefers, or undefined when it accepts none of them. */
export function preferredMediaType(
  accept: string | undefined,
  offered: readonly string[],
): string | undefined {
  if (!accept?.trim()) return offered[0];
  const ranges = parseAccept(accept);
  let chosen: { mediaType: string; q: number } | undefined;
  for (const mediaType of offered) {
    const q = qualityOf(ranges, mediaType);
    if (q > 0 && (!chosen || q > chosen.q)) chosen = { mediaType, q };
  }
  return chosen?.mediaType;
}
