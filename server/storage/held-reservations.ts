/**
 * Reservations held in memory (SQLite, one process writing the file: LedgerOptions.holdsInMemory). A request's
 * reservation lives as long as the request: made before its work, captured or released when it ends. In the
 * rows it cost the reservation's transaction an INSERT of the held row and an UPDATE of the account's reserved
 * sum, and the capture's an UPDATE claiming the row and the same UPDATE of the account undone: three writes of
 * shared pages (the account's, two indexes' last leaves) for a state nobody reads outside this process, and a
 * crash undid by the expiry sweep only. Here a reservation reads the account as before and checks it against
 * its balance less the rows' reserved sum less what is held here; it holds in memory and writes nothing. A
 * reservation of free USD (no DIEM stake, no spend limit on its key, none of the caller's statements) runs no
 * transaction at all when none is open on the connection and the process is not loaded (no group of several
 * committed lately): its one read runs at once and synchronously (Database.readNow), and the check and the
 * hold follow in the same turn; otherwise its transaction runs as before (SQLite's write lock orders it with
 * every capture of the account). The row is written
 * once, settled: by the capture (status `captured`, in the capture's transaction, before the CHARGE entries
 * that refer to it), the release (`released`) or the sweep (`expired`). A crash loses the holds and nothing
 * else: no money had moved.
 *
 * Exact because every hold's account is read as committed (at once with no transaction open, or inside a
 * write transaction of the one connection, which a failed group undoes with the hold), and a hold is let go only
 * once what settles it is committed: between that commit and the letting go, a reservation of the account sees
 * the charge twice (in the balance and in the hold), never not at all. Nothing is awaited between the read's
 * answer and the hold in the at-once path, and while a reservation's transaction is open every other one waits
 * (for the connection, or in its group after it: an at-once hold needs no transaction open), so two
 * reservations of an account never both count the same money as free.
 *
 * A reservation settles once: `settle` marks it as settling before the first statement of what settles it;
 * another settlement of it (a capture racing the release of a request whose client left, the sweep) waits for
 * that one, then finds it gone (the caller reads the row then) or, should that one have failed, held again.
 *
 * Only USD is held here; a reservation that draws on a DIEM allowance keeps its rows (the day's reserved DIEM
 * is a row the allowance is checked against). Every other writer of balances in the process (the reservations
 * in rows, a key's spend limit) adds what is held here to the rows' (`usdOf`, `usdOfKey`). What another process
 * reads of the file (the operator CLI's balances) does not include it.
 */
import type { Database } from './database.ts';
import type { Reservation } from './ledger.ts';

type Record = { reservation: Reservation; settling: Promise<unknown> | undefined };

/** What `settle` answers when the reservation is not held here (the caller then reads its row). */
export const NOT_HELD: unique symbol = Symbol('not held in memory');

export type HeldReservations = ReturnType<typeof createHeldReservations>;

const byDatabase = new WeakMap<Database, HeldReservations>();

/** The holds of every ledger on `database` (one process: they share its accounts). */
export function heldReservationsOf(database: Database): HeldReservations {
  let held = byDatabase.get(database);
  if (!held) {
    held = createHeldReservations();
    byDatabase.set(database, held);
  }
  return held;
}

/** The USD held in memory for `accountId` on `database` (0 when nothing holds in memory there). */
export function heldUsdOf(database: Database, accountId: string): bigint {
  return byDatabase.get(database)?.usdOf(accountId) ?? 0n;
}

function add(sums: Map<string, bigint>, key: string, amount: bigint): void {
  const sum = (sums.get(key) ?? 0n) + amount;
  if (sum === 0n) sums.delete(key);
  else sums.set(key, sum);
}

export function createHeldReservations() {
  const records = new Map<string, Record>();
  const byAccount = new Map<string, bigint>();
  const byKey = new Map<string, bigint>();
  let total = 0n;

  function drop(record: Record): void {
    const { reservation } = record;
    if (records.get(reservation.id) !== record) return;
    records.delete(reservation.id);
    add(byAccount, reservation.accountId, -reservation.usdNano);
    if (reservation.apiKeyId !== null) add(byKey, reservation.apiKeyId, -reservation.usdNano);
    total -= reservation.usdNano;
  }

  return {
    /** USD held for the account. */
    usdOf(accountId: string): bigint {
      return byAccount.get(accountId) ?? 0n;
    },

    /** USD held for reservations charged to the key. */
    usdOfKey(apiKeyId: string): bigint {
      return byKey.get(apiKeyId) ?? 0n;
    },

    /** USD held across accounts. */
    total(): bigint {
      return total;
    },

    /** Holds `reservation` (USD only: its `diemNano` is 0); the caller checked it fits, in the same turn. */
    hold(reservation: Reservation): void {
      const record: Record = { reservation, settling: undefined };
      records.set(reservation.id, record);
      add(byAccount, reservation.accountId, reservation.usdNano);
      if (reservation.apiKeyId !== null) add(byKey, reservation.apiKeyId, reservation.usdNano);
      total += reservation.usdNano;
    },

    /** Lets go of a hold whose reservation was not made after all (its transaction failed). */
    forget(reservation: Reservation): void {
      const record = records.get(reservation.id);
      if (record) drop(record);
    },

    /** The held reservation `id` (also while it settles), or undefined. */
    get(id: string): Reservation | undefined {
      return records.get(id)?.reservation;
    },

    /** Every held reservation (for checks and tests). */
    list(): Reservation[] {
      return [...records.values()].map((record) => record.reservation);
    },

    /** The held reservations that expire at or before `at` and are not settling. */
    due(at: number): Reservation[] {
      const due: Reservation[] = [];
      for (const record of records.values()) {
        if (record.settling === undefined && record.reservation.expiresAtMs <= at)
          due.push(record.reservation);
      }
      return due;
    },

    /**
     * Settles the held reservation `id` with `fn` (which writes its settled row): the hold is let go once `fn`
     * resolves, kept when it rejects. NOT_HELD when `id` is not held here (not any more: settled by another).
     */
    async settle<T>(id: string, fn: (reservation: Reservation) => Promise<T>): Promise<T | typeof NOT_HELD> {
      for (;;) {
        const record = records.get(id);
        if (!record) return NOT_HELD;
        if (record.settling) {
          await record.settling.then(
            () => undefined,
            () => undefined,
          );
          continue;
        }
        const settling = fn(record.reservation);
        record.settling = settling;
        try {
          const result = await settling;
          drop(record);
          return result;
        } catch (error) {
          record.settling = undefined;
          throw error;
        }
      }
    },
  };
}
