/**
 * `extend(a, b)`: a new object with `a`'s own enumerable properties, then `b`'s: what `{ ...a, ...b }` or
 * `{ ...a, k: v }` makes. The modules on a request's path use it instead of an object literal that starts with
 * a spread and goes on: once such a literal's code is warm, V8 11 (Node 20) gives every object it makes a
 * hidden class of its own for each member after the spread, allocated in the old generation (about 400 ns a
 * member, and garbage for the next mark-compact; 14 of them per request on the chat upstream adapter's path).
 * `Object.assign` onto a fresh object follows the shared hidden classes. `test/unit/object-literals.test.ts`
 * shows the difference and keeps such literals out of those modules.
 */
export function extend<A extends object, B extends object>(a: A, b: B): NoInfer<Omit<A, keyof B> & B> {
  return Object.assign({}, a, b) as Omit<A, keyof B> & B;
}

/**
 * Sets `name` on `object` as an own data property, as `Object.fromEntries` and JSON.parse do: a `__proto__` key is
 * a property like any other, never the object's prototype (which an assignment would set).
 */
export function setOwn(object: Record<string, unknown>, name: string, value: unknown): void {
  if (name === '__proto__')
    Object.defineProperty(object, name, { value, writable: true, enumerable: true, configurable: true });
  else object[name] = value;
}

/**
 * The map under `key` in `outer`, made and added when there is none: for counters and caches kept by one key
 * and then another, where a key joined from both would be a new string to hash on every lookup.
 */
export function innerMap<K, L, V>(outer: Map<K, Map<L, V>>, key: K): Map<L, V> {
  let inner = outer.get(key);
  if (!inner) {
    inner = new Map();
    outer.set(key, inner);
  }
  return inner;
}

/**
 * Whether a hook's answer is a promise to wait for, or the value itself (a hook answers at once when it has
 * nothing to wait for: no promise made, no `await` of a value).
 */
export function isPromise<T>(value: T | Promise<T>): value is Promise<T> {
  return typeof (value as { then?: unknown } | undefined)?.then === 'function';
}

/** `then` applied to a hook's answer: at once to a value, after it resolves to a promise. */
export function whenReady<T, R>(value: T | Promise<T>, then: (value: T) => R): R | Promise<Awaited<R>> {
  return isPromise(value) ? (value.then(then) as Promise<Awaited<R>>) : then(value);
}
