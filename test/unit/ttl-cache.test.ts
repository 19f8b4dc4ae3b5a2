/**
 * createTtlCache (server/domains/ttl-cache.ts): one load per key per `ttlMs`, shared by concurrent callers; a
 * failed load is not kept; `peek` answers the loaded value itself only while it is fresh.
 */
import { describe, expect, test } from 'vitest';
import { createTtlCache } from '../../server/domains/ttl-cache.ts';

function counting(ttlMs: number, values: Record<string, boolean | Error>) {
  let at = 1_000;
  const loads: string[] = [];
  const cache = createTtlCache(
    async (key: string) => {
      loads.push(key);
      const value = values[key];
      if (value instanceof Error) throw value;
      return value ?? false;
    },
    { ttlMs, now: () => at, maxEntries: 2 },
  );
  return { cache, loads, advance: (ms: number) => (at += ms) };
}

describe('createTtlCache', () => {
  test('loads once per key within ttlMs; concurrent callers share the load; again once it expired', async () => {
    const { cache, loads, advance } = counting(100, { a: true });
    const [x, y] = await Promise.all([cache.get('a'), cache.get('a')]);
    expect([x, y]).toEqual([true, true]);
    expect(await cache.get('a')).toBe(true);
    expect(loads).toEqual(['a']);
    advance(100);
    expect(await cache.get('a')).toBe(true);
    expect(loads).toEqual(['a', 'a']);
  });

  test('peek: nothing before the load ends, the value itself after, nothing once expired or deleted', async () => {
    const { cache, advance } = counting(100, { a: true, b: false });
    expect(cache.peek('a')).toBeUndefined();
    const loading = cache.get('a');
    expect(cache.peek('a')).toBeUndefined();
    await loading;
    expect(cache.peek('a')).toEqual({ value: true });
    // A false value is a value: told apart from "not loaded".
    await cache.get('b');
    expect(cache.peek('b')).toEqual({ value: false });
    advance(99);
    expect(cache.peek('a')).toEqual({ value: true });
    advance(1);
    expect(cache.peek('a')).toBeUndefined();
    await cache.get('a');
    expect(cache.peek('a')).toEqual({ value: true });
    cache.delete('a');
    expect(cache.peek('a')).toBeUndefined();
  });

  test('a failed load is not kept: the next get loads again, and peek has nothing', async () => {
    const failure = new Error('down');
    const values: Record<string, boolean | Error> = { a: failure };
    const { cache, loads } = counting(100, values);
    await expect(cache.get('a')).rejects.toBe(failure);
    expect(cache.peek('a')).toBeUndefined();
    values.a = true;
    expect(await cache.get('a')).toBe(true);
    expect(loads).toEqual(['a', 'a']);
    expect(cache.peek('a')).toEqual({ value: true });
  });

  test('at most maxEntries keys, the oldest forgotten first; ttlMs 0 keeps nothing', async () => {
    const { cache, loads } = counting(100, {});
    await cache.get('a');
    await cache.get('b');
    await cache.get('c');
    expect(cache.peek('a')).toBeUndefined();
    expect(cache.peek('c')).toEqual({ value: false });
    await cache.get('a');
    expect(loads).toEqual(['a', 'b', 'c', 'a']);
    const none = counting(0, { a: true });
    await none.cache.get('a');
    await none.cache.get('a');
    expect(none.loads).toEqual(['a', 'a']);
    expect(none.cache.peek('a')).toBeUndefined();
  });
});
