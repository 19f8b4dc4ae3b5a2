/**
 * A small read-through cache with a time bound: `get(key)` loads once per `ttlMs` (concurrent callers share
 * the load in flight), `delete(key)` forgets at once, `peek(key)` answers the loaded value itself, without a
 * promise, while it is fresh. For slowly changing facts read on every request (an account's tier), never for
 * money: balances and reservations always go to the database.
 */
export type TtlCache<K, V> = {
  get(key: K): Promise<V>;
  /** The value `get` would resolve with, when it is loaded and fresh; undefined otherwise (call `get`). */
  peek(key: K): { value: V } | undefined;
  delete(key: K): void;
};

type Entry<V> = { value: Promise<V>; until: number; loaded: { value: V } | undefined };

export function createTtlCache<K, V>(
  load: (key: K) => Promise<V>,
  options: { ttlMs: number; maxEntries?: number; now?: () => number },
): TtlCache<K, V> {
  const now = options.now ?? Date.now;
  const maxEntries = options.maxEntries ?? 10_000;
  const entries = new Map<K, Entry<V>>();
  return {
    get(key) {
      if (options.ttlMs <= 0) return load(key);
      const at = now();
      const hit = entries.get(key);
      if (hit && hit.until > at) return hit.value;
      if (hit) entries.delete(key);
      if (entries.size >= maxEntries) {
        const oldest = entries.keys().next().value;
        if (oldest !== undefined) entries.delete(oldest);
      }
      const value = load(key);
      const entry: Entry<V> = { value, until: at + options.ttlMs, loaded: undefined };
      entries.set(key, entry);
      value.then(
        (loaded) => {
          entry.loaded = { value: loaded };
        },
        // A failed load is not kept: the next caller tries again.
        () => {
          if (entries.get(key) === entry) entries.delete(key);
        },
      );
      return value;
    },
    peek(key) {
      const hit = entries.get(key);
      return hit && hit.until > now() ? hit.loaded : undefined;
    },
    delete(key) {
      entries.delete(key);
    },
  };
}
