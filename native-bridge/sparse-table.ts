/**
 * A sparse embedding partition in flat typed arrays: rows stored densely in
 * the order they were created (values and optimizer state in one
 * Float32Array each), found through an index with open addressing and
 * linear probing over Uint32 ids. A `Map<number, Float32Array>` costs ~100
 * bytes and a pointer chase per row; this costs 4·(dim·(1+slots)) + 8 bytes
 * per row plus 8 bytes per index slot, and keeps rows contiguous for the
 * optimizer loops. An index slot's id and its row sit side by side (one
 * cache line per probe), and updates run on the rows where they are stored.
 *
 * A row never moves (but for `remove`, which packs the rows kept): growing
 * the table rehashes only the index (two ints a row) and copies the row
 * arrays in one piece. (When rows lived in the hash
 * slots, every growth re-inserted every row at a new random place: creating
 * 280 k rows of dim 32 spent 84 % of its time there, and a CPU profile of a
 * shard in one bench:hetero run, 3.2 s of self time.) "Slot" in the methods below
 * is a row's place in the row arrays.
 *
 * Rows are created on first pull with a deterministic initialiser of
 * (seed, table, id), so every replica and every restart agrees on a row it
 * never stored.
 *
 * Ids are unsigned 32-bit keys; an `Int32Array` id is read as its unsigned
 * value (`id >>> 0`), so negative numbers never reach the key array.
 */
import { InvalidTensorError } from '../runtime/errors.ts';
import { hashString } from '../runtime/random.ts';
import { assertLrScale, assertStep, firstNonFinite, type Optimizer } from './optimizers.ts';

/** Options of `SparseTable.applyGradients`. */
export interface ApplyOptions {
  /**
   * The caller has checked the gradient already (every value finite, as a
   * shard does for a whole push before applying any of it): one pass less.
   */
  validated?: boolean;
}

export interface SparseTableOptions {
  table: string;
  dim: number;
  /** Optimizer state floats per row element (Adam: 2, Adagrad/momentum: 1, SGD: 0). */
  stateSlots: number;
  seed: number;
  /** Rows start uniform in [-initScale, initScale]. */
  initScale: number;
  initialCapacity: number;
  /** Starting value of each state slot (e.g. Adagrad's initial accumulator); null or absent = zeros. */
  initialState?: readonly number[] | null;
}

/** Plain data for snapshots and migrations; `T | null`-free because every field is always present. */
export interface SparseTableSnapshot {
  table: string;
  dim: number;
  stateSlots: number;
  ids: Uint32Array;
  values: Float32Array;
  state: Float32Array;
  steps: Uint32Array;
}

interface ApplyScratch {
  rows: number;
  hashKeys: Uint32Array;
  hashRows: Int32Array;
  uniqueIds: Uint32Array;
  /** Compact row of each gradient entry. */
  rowOf: Int32Array;
  merged: Float32Array;
  rowSlots: Int32Array;
}

/** An index slot's row field when it holds no id; otherwise it holds row + 1. */
const EMPTY = 0;
/** Floats from one cache line to the next (64 bytes). */
const LINE_FLOATS = 16;
/**
 * Rows brought into the cache, then updated or copied, at a time: enough for
 * their misses to overlap, few enough that they are still in the cache when
 * used (4096 rows of 64 bytes at once outgrew the L2 cache and ran ~15 %
 * slower).
 */
export const ROW_CHUNK = 256;
const MAX_LOAD = 0.7;

export function mix32(h: number): number {
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** A pending frozen copy (`freezeCopy`): rows as they were before their first update since, and the rows created since. */
interface Cow {
  saved: Map<number, { values: Float32Array; state: Float32Array; steps: number }>;
  created: Set<number>;
  done: SparseTableSnapshot | null;
}

export class SparseTable {
  readonly table: string;
  readonly dim: number;
  readonly stateSlots: number;
  readonly seed: number;
  readonly initScale: number;
  /** Index slots (a power of two), at most MAX_LOAD of them used. */
  private capacity: number;
  /** Index slot i: `[2i]` the id's bits (as int32), `[2i + 1]` its row + 1, or EMPTY. */
  private slotKeys: Int32Array;
  /** Rows the row arrays have room for. */
  private rowCapacity: number;
  /** The id of each row. */
  private rowIds: Uint32Array;
  /** [rowCapacity * dim] */
  values: Float32Array;
  /** [rowCapacity * dim * stateSlots]: row s, state slot k at `s·dim·stateSlots + k·dim`. */
  state: Float32Array;
  /** Per-row update count (Adam bias correction is per row: only touched rows advance). */
  steps: Uint32Array;
  /** Rows stored: rows 0 … count − 1. */
  private count = 0;
  private scratch: ApplyScratch | null = null;
  /** Keeps the touch loops of `slotsOf`/`touchRows` from being optimised away. */
  private sink = 0;
  private readonly tableSalt: number;
  private readonly initialState: readonly number[] | null;

  constructor(opts: SparseTableOptions) {
    if (!Number.isInteger(opts.dim) || opts.dim <= 0) throw new RangeError(`sparse table ${opts.table}: dim must be a positive integer, got ${opts.dim}`);
    this.table = opts.table;
    this.dim = opts.dim;
    this.stateSlots = opts.stateSlots;
    this.seed = opts.seed >>> 0;
    this.initScale = opts.initScale;
    this.tableSalt = hashString(opts.table, this.seed);
    const init = opts.initialState ?? null;
    if (init !== null && init.length !== opts.stateSlots) throw new RangeError(`sparse table ${opts.table}: initialState has ${init.length} values for ${opts.stateSlots} state slots`);
    this.initialState = init !== null && init.some((v) => v !== 0) ? [...init] : null;
    this.capacity = 16;
    while (this.capacity * MAX_LOAD < opts.initialCapacity) this.capacity *= 2;
    this.slotKeys = new Int32Array(2 * this.capacity);
    this.rowCapacity = Math.max(16, Math.ceil(opts.initialCapacity));
    this.rowIds = new Uint32Array(this.rowCapacity);
    this.values = new Float32Array(this.rowCapacity * this.dim);
    this.state = new Float32Array(this.rowCapacity * this.dim * this.stateSlots);
    this.steps = new Uint32Array(this.rowCapacity);
  }

  get size(): number { return this.count; }
  /** Bytes held by the table's arrays. */
  get bytes(): number {
    return this.slotKeys.byteLength + this.rowIds.byteLength + this.values.byteLength + this.state.byteLength + this.steps.byteLength;
  }

  /** Slot of `id`, or -1. */
  find(id: number): number {
    const key = id | 0;
    const mask = this.capacity - 1;
    const sk = this.slotKeys;
    for (let i = mix32(id >>> 0) & mask; ; i = (i + 1) & mask) {
      const row = sk[2 * i + 1]!;
      if (row === EMPTY) return -1;
      if (sk[2 * i] === key) return row - 1;
    }
  }

  /** Slot of `id`, creating and initialising the row when absent. */
  slotOf(id: number): number {
    id >>>= 0;
    const found = this.find(id);
    if (found >= 0) return found;
    this.reserve(this.count + 1);
    const slot = this.insertEmpty(id);
    this.initRow(id, slot);
    return slot;
  }

  has(id: number): boolean { return this.find(id) >= 0; }

  /**
   * The slots of many ids at once (rows created where missing), into `out`.
   * Faster than `slotOf` per id on large tables: a first pass only touches
   * each id's hash bucket, so the cache misses of all ids overlap instead of
   * being paid one after the other. Slots stay valid until the next call that
   * may create rows (growth moves them).
   */
  slotsOf(ids: ArrayLike<number>, out: Int32Array): void {
    const n = ids.length;
    const mask = this.capacity - 1;
    const sk = this.slotKeys;
    let touched = 0;
    for (let k = 0; k < n; k++) {
      const i = mix32(ids[k]! >>> 0) & mask;
      touched += sk[2 * i + 1]!;
    }
    this.sink = touched;
    let missing = 0;
    for (let k = 0; k < n; k++) {
      const s = this.find(ids[k]!);
      out[k] = s;
      if (s < 0) missing++;
    }
    if (missing === 0) return;
    // Grow once for all new rows (rows found so far stay where they are).
    this.reserve(this.count + missing);
    for (let k = 0; k < n; k++) if (out[k]! < 0) out[k] = this.slotOf(ids[k]!);
  }

  /**
   * Touches every cache line of each row's values (and, with `withState`, of
   * its optimizer state and step; see `slotsOf`): later passes over the rows
   * then hit the cache. The first and last element of each span, and one per
   * 64 bytes between: a row of 64 bytes mostly spans two lines, as the
   * arrays' start is not line-aligned.
   */
  touchRows(slots: Int32Array, count: number, withState = false): void {
    const v = this.values;
    const d = this.dim;
    let touched = 0;
    for (let r = 0; r < count; r++) {
      const at = slots[r]! * d;
      for (let j = 0; j < d; j += LINE_FLOATS) touched += v[at + j]!;
      touched += v[at + d - 1]!;
    }
    if (withState) {
      const st = this.state;
      const steps = this.steps;
      const sd = d * this.stateSlots;
      for (let r = 0; r < count; r++) {
        const s = slots[r]!;
        touched += steps[s]!;
        if (sd === 0) continue;
        const at = s * sd;
        for (let j = 0; j < sd; j += LINE_FLOATS) touched += st[at + j]!;
        touched += st[at + sd - 1]!;
      }
    }
    this.sink = touched;
  }

  /** Copies the rows of `ids` into `out` ([ids.length * dim]), creating missing rows. */
  pull(ids: ArrayLike<number>, out: Float32Array = new Float32Array(ids.length * this.dim)): Float32Array {
    const d = this.dim;
    for (let k = 0; k < ids.length; k++) {
      const s = this.slotOf(ids[k]!);
      out.set(this.values.subarray(s * d, s * d + d), k * d);
    }
    return out;
  }

  /**
   * Like `pull` but read-only: rows that do not exist yet are written as their
   * initial values without being stored (evaluation must not grow the table).
   */
  lookup(ids: ArrayLike<number>, out: Float32Array = new Float32Array(ids.length * this.dim)): Float32Array {
    const d = this.dim;
    for (let k = 0; k < ids.length; k++) {
      const s = this.find(ids[k]!);
      if (s >= 0) out.set(this.values.subarray(s * d, s * d + d), k * d);
      else this.initialRow(ids[k]! >>> 0, out.subarray(k * d, k * d + d));
    }
    return out;
  }

  /**
   * Applies one sparse gradient through `optimizer`, lazily: only the rows of
   * `ids` change, each with its own update count (Adam's bias correction), and
   * `scheduleStep` drives the learning-rate schedule. Duplicate ids are merged
   * first (their gradients summed: a row used twice gets one update with the
   * total gradient). Rows not stored yet are created with their initial values.
   *
   * All-or-nothing: a NaN/Inf gradient throws InvalidTensorError before any
   * row, state or step changes (unless `validated`: the caller checked). Returns
   * the number of distinct rows updated.
   *
   * The optimizer updates the rows where the table keeps them
   * (`Optimizer.updateTableRows`), after one pass that brings every row's cache
   * lines in: on a large table the cache misses of all rows overlap instead of
   * being paid one after the other. Scratch arrays are kept between calls:
   * this is a parameter server's hot path, and per-call allocations showed up
   * as GC.
   */
  applyGradients(ids: ArrayLike<number>, grads: Float32Array, optimizer: Optimizer, scheduleStep: number, lrScale = 1, opts: ApplyOptions = {}): number {
    const d = this.dim;
    const slots = this.stateSlots;
    if (optimizer.stateSlots() !== slots) {
      throw new InvalidTensorError(`sparse table ${this.table} keeps ${slots} state slots per element, optimizer ${optimizer.config.type} needs ${optimizer.stateSlots()}`, { data: { tensor: this.table } });
    }
    if (grads.length !== ids.length * d) {
      throw new InvalidTensorError(`gradient for ${this.table} has ${grads.length} floats for ${ids.length} ids of dim ${d}`, { data: { tensor: this.table } });
    }
    // NaN/Inf anywhere: refuse before anything changes.
    const bad = opts.validated === true ? -1 : firstNonFinite(grads);
    if (bad >= 0) {
      const k = Math.floor(bad / d);
      const g = grads[bad]!;
      throw new InvalidTensorError(`gradient for ${this.table} has ${Number.isNaN(g) ? 'NaN' : 'Infinity'} at id ${ids[k]! >>> 0} (entry ${k}), element ${bad % d}; nothing was updated`, { data: { tensor: this.table, index: k, id: ids[k]! >>> 0 } });
    }
    // The step and rate are checked before anything changes too (the optimizer checks them again).
    assertStep('scheduleStep', scheduleStep);
    assertLrScale(lrScale);
    // Find the distinct ids (first-seen order); `rowOf[k]` is entry k's compact row.
    const n = ids.length;
    const sc = this.scratchFor(n);
    let bits = 4;
    while (1 << bits < n * 2) bits++;
    const mask = (1 << bits) - 1;
    const hashKeys = sc.hashKeys;
    const hashRows = sc.hashRows;
    hashRows.fill(-1, 0, 1 << bits);
    const uniqueIds = sc.uniqueIds;
    const rowOf = sc.rowOf;
    let u = 0;
    for (let k = 0; k < n; k++) {
      const id = ids[k]! >>> 0;
      let h = mix32(id) & mask;
      while (hashRows[h] !== -1 && hashKeys[h] !== id) h = (h + 1) & mask;
      let row = hashRows[h]!;
      if (row === -1) { row = u++; hashKeys[h] = id; hashRows[h] = row; uniqueIds[row] = id; }
      rowOf[k] = row;
    }
    // Distinct ids (the usual case: workers send unique ids) use the gradients as they are;
    // otherwise the rows of one id are summed into one.
    let rowGrads = grads;
    if (u < n) {
      const merged = sc.merged;
      merged.fill(0, 0, u * d);
      for (let k = 0; k < n; k++) {
        const o = rowOf[k]! * d;
        const gk = k * d;
        for (let j = 0; j < d; j++) merged[o + j] = merged[o + j]! + grads[gk + j]!;
      }
      rowGrads = merged.subarray(0, u * d);
    }
    // slotsOf makes room for every missing row at once (one growth at most).
    const rowSlots = sc.rowSlots;
    this.slotsOf(uniqueIds.subarray(0, u), rowSlots);
    // A frozen copy pending (freezeCopy): each row is saved before its first update.
    const cow = this.cow;
    if (cow !== null) for (let r = 0; r < u; r++) this.saveRow(cow, uniqueIds[r]! >>> 0, rowSlots[r]!);
    // In chunks: a chunk's rows are brought into the cache together (their misses overlap), then updated while still there.
    for (let c = 0; c < u; c += ROW_CHUNK) {
      const count = Math.min(ROW_CHUNK, u - c);
      const chunk = rowSlots.subarray(c, c + count);
      this.touchRows(chunk, count, true);
      optimizer.updateTableRows({
        values: this.values, state: this.state, rowSteps: this.steps, slots: chunk, count, grads: rowGrads.subarray(c * d, (c + count) * d), dim: d, scheduleStep, lrScale,
      });
    }
    return u;
  }

  /** Scratch arrays for a call with `n` gradient rows (grown, never shrunk). */
  private scratchFor(n: number): ApplyScratch {
    let sc = this.scratch;
    if (sc !== null && sc.rows >= n) return sc;
    const rows = Math.max(n, sc === null ? 64 : sc.rows * 2);
    let hashSize = 16;
    while (hashSize < rows * 2) hashSize *= 2;
    const d = this.dim;
    sc = {
      rows,
      hashKeys: new Uint32Array(hashSize),
      hashRows: new Int32Array(hashSize),
      uniqueIds: new Uint32Array(rows),
      rowOf: new Int32Array(rows),
      merged: new Float32Array(rows * d),
      rowSlots: new Int32Array(rows),
    };
    this.scratch = sc;
    return sc;
  }

  /** Deterministic init of (seed, table, id): same row on every shard, replica and restart. */
  initialRow(id: number, out: Float32Array = new Float32Array(this.dim)): Float32Array {
    const base = mix32(this.tableSalt ^ mix32(id ^ 0x9e3779b9));
    for (let j = 0; j < this.dim; j++) {
      const u = mix32(base + Math.imul(j + 1, 0x27d4eb2d)) / 4294967296;
      out[j] = (2 * u - 1) * this.initScale + 0; // + 0: scale 0 gives +0, not -0
    }
    return out;
  }

  /** Every stored id (in the order the rows were created). */
  ids(): Uint32Array {
    return this.rowIds.slice(0, this.count);
  }

  /** A copy of the rows whose id passes `keep` (all rows when null), for checkpoints and migration. */
  snapshot(keep: ((id: number) => boolean) | null = null): SparseTableSnapshot {
    const d = this.dim, sd = d * this.stateSlots, n = this.count;
    if (keep === null) {
      // Rows 0 … count − 1 are the table: copied in one piece each.
      return {
        table: this.table, dim: d, stateSlots: this.stateSlots, ids: this.ids(), values: this.values.slice(0, n * d),
        state: this.state.slice(0, n * sd), steps: this.steps.slice(0, n),
      };
    }
    const rows: number[] = [];
    for (let r = 0; r < n; r++) if (keep(this.rowIds[r]!)) rows.push(r);
    const ids = new Uint32Array(rows.length);
    const values = new Float32Array(rows.length * d);
    const state = new Float32Array(rows.length * sd);
    const steps = new Uint32Array(rows.length);
    for (let k = 0; k < rows.length; k++) {
      const s = rows[k]!;
      ids[k] = this.rowIds[s]!;
      values.set(this.values.subarray(s * d, s * d + d), k * d);
      if (sd) state.set(this.state.subarray(s * sd, s * sd + sd), k * sd);
      steps[k] = this.steps[s]!;
    }
    return { table: this.table, dim: d, stateSlots: this.stateSlots, ids, values, state, steps };
  }

  /**
   * The table as it is now, for a snapshot taken later (a checkpoint's cut:
   * the freeze costs nothing while training stands still, the copy is made
   * after it resumed). Copy-on-write: from now on a row is saved as it was
   * before its first update, and rows created later are left out; calling
   * the result builds the snapshot of this moment (its rows in the order
   * `snapshot()` gives them) and ends the copying.
   * A later `freezeCopy`, `restore` or `remove` builds it at once.
   */
  freezeCopy(): () => SparseTableSnapshot {
    this.settleCow();
    const cow: Cow = { saved: new Map(), created: new Set(), done: null };
    this.cow = cow;
    return () => {
      if (cow.done === null) cow.done = this.compactCow(cow);
      if (this.cow === cow) this.cow = null;
      return cow.done;
    };
  }

  /** The copy-on-write of the last `freezeCopy` not yet built; null: none. */
  private cow: Cow | null = null;

  /** Builds the pending frozen snapshot now (before a change that copy-on-write does not follow row by row). */
  private settleCow(): void {
    const cow = this.cow;
    if (cow === null) return;
    if (cow.done === null) cow.done = this.compactCow(cow);
    this.cow = null;
  }

  /** Saves row `slot` (id `id`) as it is, if it is the first change to it since the freeze. */
  private saveRow(cow: Cow, id: number, slot: number): void {
    if (cow.created.has(id) || cow.saved.has(id)) return;
    const d = this.dim, sd = d * this.stateSlots;
    cow.saved.set(id, { values: this.values.slice(slot * d, slot * d + d), state: this.state.slice(slot * sd, slot * sd + sd), steps: this.steps[slot]! });
  }

  private compactCow(cow: Cow): SparseTableSnapshot {
    const d = this.dim, sd = d * this.stateSlots;
    const rowIds = this.rowIds;
    let n = 0;
    for (let i = 0; i < this.count; i++) if (!cow.created.has(rowIds[i]!)) n++;
    const ids = new Uint32Array(n);
    const values = new Float32Array(n * d);
    const state = new Float32Array(n * sd);
    const steps = new Uint32Array(n);
    let k = 0;
    for (let i = 0; i < this.count; i++) {
      const id = rowIds[i]!;
      if (cow.created.has(id)) continue;
      ids[k] = id;
      const was = cow.saved.get(id);
      if (was !== undefined) {
        values.set(was.values, k * d);
        if (sd) state.set(was.state, k * sd);
        steps[k] = was.steps;
      } else {
        values.set(this.values.subarray(i * d, i * d + d), k * d);
        if (sd) state.set(this.state.subarray(i * sd, i * sd + sd), k * sd);
        steps[k] = this.steps[i]!;
      }
      k++;
    }
    return { table: this.table, dim: d, stateSlots: this.stateSlots, ids, values, state, steps };
  }

  /** Inserts or overwrites the rows of a snapshot. */
  restore(snap: SparseTableSnapshot): void {
    this.settleCow();
    if (snap.dim !== this.dim || snap.stateSlots !== this.stateSlots) {
      throw new RangeError(`snapshot of ${snap.table} has dim ${snap.dim}/slots ${snap.stateSlots}, table ${this.table} has ${this.dim}/${this.stateSlots}`);
    }
    const d = this.dim, sd = d * this.stateSlots;
    for (let k = 0; k < snap.ids.length; k++) {
      const id = snap.ids[k]!;
      let s = this.find(id);
      if (s < 0) {
        this.reserve(this.count + 1);
        s = this.insertEmpty(id);
      }
      this.values.set(snap.values.subarray(k * d, k * d + d), s * d);
      if (sd) this.state.set(snap.state.subarray(k * sd, k * sd + sd), s * sd);
      this.steps[s] = snap.steps[k]!;
    }
  }

  /** Removes the rows whose id passes `drop` (after they were handed to another shard). */
  remove(drop: (id: number) => boolean): number {
    this.settleCow();
    const kept = this.snapshot((id) => !drop(id));
    const removed = this.count - kept.ids.length;
    if (removed === 0) return 0;
    this.slotKeys.fill(EMPTY);
    this.count = 0;
    this.restore(kept);
    return removed;
  }

  /** Stores `id` as a new row (the caller made room: `reserve`); its slot (row). */
  private insertEmpty(id: number): number {
    const row = this.count++;
    this.rowIds[row] = id >>> 0;
    this.indexRow(id, row);
    return row;
  }

  /** Puts `id` → `row` into the index (the id is not in it). */
  private indexRow(id: number, row: number): void {
    const mask = this.capacity - 1;
    let i = mix32(id >>> 0) & mask;
    const sk = this.slotKeys;
    while (sk[2 * i + 1] !== EMPTY) i = (i + 1) & mask;
    sk[2 * i] = id | 0;
    sk[2 * i + 1] = row + 1;
  }

  private initRow(id: number, slot: number): void {
    if (this.cow !== null) this.cow.created.add(id >>> 0);
    const d = this.dim;
    this.initialRow(id, this.values.subarray(slot * d, slot * d + d));
    const sd = d * this.stateSlots;
    if (this.initialState === null) {
      if (sd) this.state.fill(0, slot * sd, slot * sd + sd);
    } else {
      for (let k = 0; k < this.stateSlots; k++) this.state.fill(this.initialState[k]!, slot * sd + k * d, slot * sd + (k + 1) * d);
    }
    this.steps[slot] = 0;
  }

  /** Grows (once) so that `rows` rows fit without another rehash or copy. */
  reserve(rows: number): void {
    if (rows > this.rowCapacity) {
      // Doubling (at least): rows are copied in one piece, they never move inside the arrays.
      const cap = Math.max(rows, this.rowCapacity * 2);
      const d = this.dim, sd = d * this.stateSlots, n = this.count;
      const ids = new Uint32Array(cap); ids.set(this.rowIds.subarray(0, n)); this.rowIds = ids;
      const values = new Float32Array(cap * d); values.set(this.values.subarray(0, n * d)); this.values = values;
      const state = new Float32Array(cap * sd); state.set(this.state.subarray(0, n * sd)); this.state = state;
      const steps = new Uint32Array(cap); steps.set(this.steps.subarray(0, n)); this.steps = steps;
      this.rowCapacity = cap;
    }
    let capacity = this.capacity;
    while (capacity * MAX_LOAD < rows) capacity *= 2;
    if (capacity > this.capacity) this.rehash(capacity);
  }

  /** A larger index over the same rows. */
  private rehash(capacity: number): void {
    this.capacity = capacity;
    this.slotKeys = new Int32Array(2 * capacity);
    const rowIds = this.rowIds;
    for (let row = 0; row < this.count; row++) this.indexRow(rowIds[row]!, row);
  }
}
