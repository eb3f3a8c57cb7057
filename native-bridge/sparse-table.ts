/**
 * A sparse embedding partition in flat typed arrays: open addressing with
 * linear probing over Uint32 ids, row values and optimizer state in one
 * Float32Array each. A `Map<number, Float32Array>` costs ~100 bytes and a
 * pointer chase per row; this costs 4·(dim·(1+slots)) + 9 bytes per slot and
 * keeps rows contiguous for the optimizer loops.
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
import type { Optimizer } from './optimizers.ts';

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

const EMPTY = 0;
const FULL = 1;
const MAX_LOAD = 0.7;

function mix32(h: number): number {
  h ^= h >>> 16; h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13; h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

export class SparseTable {
  readonly table: string;
  readonly dim: number;
  readonly stateSlots: number;
  readonly seed: number;
  readonly initScale: number;
  private capacity: number;
  private used: Uint8Array;
  private keys: Uint32Array;
  /** [capacity * dim] */
  values: Float32Array;
  /** [capacity * dim * stateSlots]: row s, state slot k at `s·dim·stateSlots + k·dim`. */
  state: Float32Array;
  /** Per-row update count (Adam bias correction is per row: only touched rows advance). */
  steps: Uint32Array;
  private count = 0;
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
    this.used = new Uint8Array(this.capacity);
    this.keys = new Uint32Array(this.capacity);
    this.values = new Float32Array(this.capacity * this.dim);
    this.state = new Float32Array(this.capacity * this.dim * this.stateSlots);
    this.steps = new Uint32Array(this.capacity);
  }

  get size(): number { return this.count; }
  /** Bytes held by the table's arrays. */
  get bytes(): number {
    return this.used.byteLength + this.keys.byteLength + this.values.byteLength + this.state.byteLength + this.steps.byteLength;
  }

  /** Slot of `id`, or -1. */
  find(id: number): number {
    id >>>= 0;
    const mask = this.capacity - 1;
    for (let i = mix32(id) & mask; ; i = (i + 1) & mask) {
      if (this.used[i] === EMPTY) return -1;
      if (this.keys[i] === id) return i;
    }
  }

  /** Slot of `id`, creating and initialising the row when absent. */
  slotOf(id: number): number {
    id >>>= 0;
    const found = this.find(id);
    if (found >= 0) return found;
    if ((this.count + 1) > this.capacity * MAX_LOAD) this.grow();
    const slot = this.insertEmpty(id);
    this.initRow(id, slot);
    return slot;
  }

  has(id: number): boolean { return this.find(id) >= 0; }

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
   * row, state or step changes. Returns the number of distinct rows updated.
   *
   * The touched rows are copied into compact scratch arrays and updated with
   * one `updateSparse` call, so the optimizer sees plain row-major tables (its
   * per-slot state layout differs from ours) and validates once per call.
   */
  applyGradients(ids: ArrayLike<number>, grads: Float32Array, optimizer: Optimizer, scheduleStep: number, lrScale = 1): number {
    const d = this.dim;
    const slots = this.stateSlots;
    if (optimizer.stateSlots() !== slots) {
      throw new InvalidTensorError(`sparse table ${this.table} keeps ${slots} state slots per element, optimizer ${optimizer.config.type} needs ${optimizer.stateSlots()}`, { data: { tensor: this.table } });
    }
    if (grads.length !== ids.length * d) {
      throw new InvalidTensorError(`gradient for ${this.table} has ${grads.length} floats for ${ids.length} ids of dim ${d}`, { data: { tensor: this.table } });
    }
    // Merge duplicates by id into compact rows (first-seen order), checking for NaN/Inf as we go.
    const n = ids.length;
    let bits = 4;
    while (1 << bits < n * 2) bits++;
    const mask = (1 << bits) - 1;
    const hashKeys = new Uint32Array(1 << bits);
    const hashRows = new Int32Array(1 << bits).fill(-1);
    const uniqueIds = new Uint32Array(n);
    const merged = new Float32Array(n * d);
    let u = 0;
    for (let k = 0; k < n; k++) {
      const id = ids[k]! >>> 0;
      let h = mix32(id) & mask;
      while (hashRows[h] !== -1 && hashKeys[h] !== id) h = (h + 1) & mask;
      let row = hashRows[h]!;
      if (row === -1) { row = u++; hashKeys[h] = id; hashRows[h] = row; uniqueIds[row] = id; }
      for (let j = 0; j < d; j++) {
        const g = grads[k * d + j]!;
        if (g - g !== 0) {
          throw new InvalidTensorError(`gradient for ${this.table} has ${Number.isNaN(g) ? 'NaN' : 'Infinity'} at id ${id} (entry ${k}), element ${j}; nothing was updated`, { data: { tensor: this.table, index: k, id } });
        }
        merged[row * d + j] = merged[row * d + j]! + g;
      }
    }
    // Create missing rows first: growth moves slots, so slots are read only after every row exists.
    if (this.count + u > this.capacity * MAX_LOAD) this.reserve(this.count + u);
    const rowSlots = new Int32Array(u);
    for (let r = 0; r < u; r++) rowSlots[r] = this.slotOf(uniqueIds[r]!);

    const sd = d * slots;
    const table = new Float32Array(u * d);
    const state = Array.from({ length: slots }, () => new Float32Array(u * d));
    const rowSteps = new Uint32Array(u);
    for (let r = 0; r < u; r++) {
      const s = rowSlots[r]!;
      table.set(this.values.subarray(s * d, s * d + d), r * d);
      for (let k = 0; k < slots; k++) state[k]!.set(this.state.subarray(s * sd + k * d, s * sd + k * d + d), r * d);
      rowSteps[r] = this.steps[s]!;
    }
    const rows = new Int32Array(u);
    for (let r = 0; r < u; r++) rows[r] = r;
    optimizer.updateSparse({
      table, state, rowSteps, rows, grads: u === n ? merged : merged.subarray(0, u * d), dim: d,
      scheduleStep, lrScale, tensorName: this.table,
    });
    for (let r = 0; r < u; r++) {
      const s = rowSlots[r]!;
      this.values.set(table.subarray(r * d, r * d + d), s * d);
      for (let k = 0; k < slots; k++) this.state.set(state[k]!.subarray(r * d, r * d + d), s * sd + k * d);
      this.steps[s] = rowSteps[r]!;
    }
    return u;
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

  /** Every stored id (order unspecified). */
  ids(): Uint32Array {
    const out = new Uint32Array(this.count);
    let k = 0;
    for (let i = 0; i < this.capacity; i++) if (this.used[i] === FULL) out[k++] = this.keys[i]!;
    return out;
  }

  /** A copy of the rows whose id passes `keep` (all rows when null), for checkpoints and migration. */
  snapshot(keep: ((id: number) => boolean) | null = null): SparseTableSnapshot {
    const d = this.dim, sd = d * this.stateSlots;
    const all = this.ids();
    const ids = keep ? all.filter(keep) : all;
    const values = new Float32Array(ids.length * d);
    const state = new Float32Array(ids.length * sd);
    const steps = new Uint32Array(ids.length);
    for (let k = 0; k < ids.length; k++) {
      const s = this.find(ids[k]!);
      values.set(this.values.subarray(s * d, s * d + d), k * d);
      if (sd) state.set(this.state.subarray(s * sd, s * sd + sd), k * sd);
      steps[k] = this.steps[s]!;
    }
    return { table: this.table, dim: d, stateSlots: this.stateSlots, ids, values, state, steps };
  }

  /** Inserts or overwrites the rows of a snapshot. */
  restore(snap: SparseTableSnapshot): void {
    if (snap.dim !== this.dim || snap.stateSlots !== this.stateSlots) {
      throw new RangeError(`snapshot of ${snap.table} has dim ${snap.dim}/slots ${snap.stateSlots}, table ${this.table} has ${this.dim}/${this.stateSlots}`);
    }
    const d = this.dim, sd = d * this.stateSlots;
    for (let k = 0; k < snap.ids.length; k++) {
      const id = snap.ids[k]!;
      let s = this.find(id);
      if (s < 0) {
        if ((this.count + 1) > this.capacity * MAX_LOAD) this.grow();
        s = this.insertEmpty(id);
      }
      this.values.set(snap.values.subarray(k * d, k * d + d), s * d);
      if (sd) this.state.set(snap.state.subarray(k * sd, k * sd + sd), s * sd);
      this.steps[s] = snap.steps[k]!;
    }
  }

  /** Removes the rows whose id passes `drop` (after they were handed to another shard). */
  remove(drop: (id: number) => boolean): number {
    const kept = this.snapshot((id) => !drop(id));
    const removed = this.count - kept.ids.length;
    if (removed === 0) return 0;
    this.used.fill(EMPTY);
    this.count = 0;
    this.restore(kept);
    return removed;
  }

  private insertEmpty(id: number): number {
    const mask = this.capacity - 1;
    let i = mix32(id) & mask;
    while (this.used[i] === FULL) i = (i + 1) & mask;
    this.used[i] = FULL;
    this.keys[i] = id;
    this.count++;
    return i;
  }

  private initRow(id: number, slot: number): void {
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

  /** Grows (once) so that `rows` rows fit without another rehash. */
  reserve(rows: number): void {
    let capacity = this.capacity;
    while (capacity * MAX_LOAD < rows) capacity *= 2;
    if (capacity > this.capacity) this.grow(capacity);
  }

  private grow(capacity = this.capacity * 2): void {
    const old = { used: this.used, keys: this.keys, values: this.values, state: this.state, steps: this.steps, capacity: this.capacity };
    this.capacity = capacity;
    this.used = new Uint8Array(this.capacity);
    this.keys = new Uint32Array(this.capacity);
    this.values = new Float32Array(this.capacity * this.dim);
    this.state = new Float32Array(this.capacity * this.dim * this.stateSlots);
    this.steps = new Uint32Array(this.capacity);
    this.count = 0;
    const d = this.dim, sd = d * this.stateSlots;
    for (let i = 0; i < old.capacity; i++) {
      if (old.used[i] !== FULL) continue;
      const s = this.insertEmpty(old.keys[i]!);
      this.values.set(old.values.subarray(i * d, i * d + d), s * d);
      if (sd) this.state.set(old.state.subarray(i * sd, i * sd + sd), s * sd);
      this.steps[s] = old.steps[i]!;
    }
  }
}
