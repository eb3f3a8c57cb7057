/**
 * hps local updates (training.local_updates): local SGD inside a window.
 *
 * A `sync` or `adaptive` window takes N steps between two exchanges with its
 * group. Without local updates every one of them computes from the
 * parameters pulled at the window's start, so the k-th step's gradient is
 * k − 1 steps stale before it leaves the worker, and the N updates the group
 * pushes all point where the first did (they overshoot). With local updates
 * each member applies its own step to its own copy, with the job's
 * optimizers, before the next step of the window:
 *
 * - dense parameters: the stepper's copy, updated in place (the next
 *   window's pull overwrites it);
 * - embedding and wide rows: the rows are pulled for every batch, so the
 *   member keeps this window's local change of each row it trained (a
 *   delta) and adds it to the row whenever a later step of the window pulls
 *   it; the deltas are dropped when the next window starts, whose pulls hold
 *   the group's update of those rows.
 *
 * The optimizers' state (Adam's moments, Adagrad's accumulators) is the
 * member's own, kept across windows: it follows this worker's gradients.
 * For rows it takes (state slots + 1) × dim floats per row the member
 * trained, in typed arrays indexed by `IdIndex` (no Map limit). What is
 * pushed is unchanged: the gradients, which the shards apply with their own
 * optimizer state.
 */
import { IdIndex, createOptimizer, firstNonFinite, type Optimizer, type OptimizerConfigInput } from '../../native-bridge/mod.ts';

export interface LocalOptimizers {
  /** The job's dense optimizer. */
  dense: OptimizerConfigInput;
  /** The job's optimizer for embedding and wide rows (ctr); null: rows are not updated locally (mlp). */
  sparse: OptimizerConfigInput | null;
}

/** One table's local rows: optimizer state and step per row (kept), this window's delta per row. */
class LocalRows {
  private readonly index = new IdIndex(1024);
  private rows = 0;
  private cap = 1024;
  private delta: Float32Array;
  private readonly state: Float32Array[];
  private rowSteps: Uint32Array;
  /** Per call of `step`: each id's row, and the rows as updated (grown, never shrunk). */
  private scratchRows = new Int32Array(0);
  private scratchValues = new Float32Array(0);
  /** The window a row's delta belongs to; a delta of an earlier window counts as zero. */
  private stamp: Int32Array;

  constructor(private readonly optimizer: Optimizer, readonly dim: number) {
    this.delta = new Float32Array(this.cap * dim);
    this.state = optimizer.allocateState(this.cap * dim);
    this.rowSteps = new Uint32Array(this.cap);
    this.stamp = new Int32Array(this.cap).fill(-1);
  }

  get size(): number { return this.rows; }

  /** Adds this window's deltas to `values` (`[ids.length, dim]`), in place. */
  overlay(ids: ArrayLike<number>, values: Float32Array, window: number): void {
    const d = this.dim;
    for (let u = 0; u < ids.length; u++) {
      const r = this.index.get(ids[u]!);
      if (r < 0 || this.stamp[r] !== window) continue;
      const from = r * d;
      const to = u * d;
      for (let c = 0; c < d; c++) values[to + c] = values[to + c]! + this.delta[from + c]!;
    }
  }

  /** One local step of every row: `values` are the rows as the step used them, `grads` their gradients (both `[ids.length, dim]`). */
  step(ids: ArrayLike<number>, values: Float32Array, grads: Float32Array, window: number, scheduleStep: number, lrScale: number): void {
    const d = this.dim;
    const n = ids.length;
    if (this.scratchRows.length < n) { this.scratchRows = new Int32Array(n); this.scratchValues = new Float32Array(n * d); }
    const rowOf = this.scratchRows;
    for (let u = 0; u < n; u++) {
      const r = this.index.getOrSet(ids[u]!, this.rows);
      if (r === this.rows) { this.rows++; if (r >= this.cap) this.grow(); }
      if (this.stamp[r] !== window) { this.delta.fill(0, r * d, r * d + d); this.stamp[r] = window; }
      rowOf[u] = r;
    }
    // The rows updated in a copy (the step's rows stay as they were used); the delta is what the update changed.
    const after = this.scratchValues;
    after.set(values.subarray(0, n * d));
    this.optimizer.updateGatheredRows({ values: after, grads, state: this.state, stateRows: rowOf, rowSteps: this.rowSteps, count: n, dim: d, scheduleStep, lrScale });
    const delta = this.delta;
    for (let u = 0; u < n; u++) {
      const at = rowOf[u]! * d;
      const from = u * d;
      for (let c = 0; c < d; c++) delta[at + c] = delta[at + c]! + (after[from + c]! - values[from + c]!);
    }
  }

  private grow(): void {
    const cap = this.cap * 2;
    const d = this.dim;
    const delta = new Float32Array(cap * d); delta.set(this.delta); this.delta = delta;
    const fresh = this.optimizer.allocateState(cap * d);
    for (let k = 0; k < this.state.length; k++) { fresh[k]!.set(this.state[k]!); this.state[k] = fresh[k]!; }
    const steps = new Uint32Array(cap); steps.set(this.rowSteps); this.rowSteps = steps;
    const stamp = new Int32Array(cap).fill(-1); stamp.set(this.stamp); this.stamp = stamp;
    this.cap = cap;
  }
}

export class LocalUpdates {
  private readonly dense: Optimizer;
  private readonly sparse: Optimizer | null;
  private readonly denseState = new Map<string, Float32Array[]>();
  private readonly tables = new Map<string, LocalRows>();
  private steps = 0;
  private window = 0;

  constructor(o: LocalOptimizers) {
    this.dense = createOptimizer(o.dense);
    this.sparse = o.sparse === null ? null : createOptimizer(o.sparse);
  }

  /** Rows the member keeps local optimizer state for, per table. */
  get rowsKept(): Record<string, number> { return Object.fromEntries([...this.tables].map(([k, t]) => [k, t.size])); }

  /** A window starts (its dense parameters are being pulled): the rows' deltas of the last one are dropped, the shards hold the group's update now. */
  newWindow(): void { this.window++; }

  /** Adds this window's local deltas to a batch's pulled rows (`[U, dim]` per table, in `ids` order), in place. */
  overlayRows(ids: ArrayLike<number>, rows: ReadonlyMap<string, Float32Array>): void {
    if (this.sparse === null || ids.length === 0) return;
    for (const [name, values] of rows) this.tables.get(name)?.overlay(ids, values, this.window);
  }

  /**
   * One local step: `dense` (the copy the next step computes from) and the
   * rows' deltas, from this step's gradients. `rowValues`: the rows as the
   * step used them (pulled plus overlay). A step whose gradients hold NaN or
   * Inf is not applied (the shards refuse it and say so). Returns whether
   * it was applied.
   */
  step(dense: ReadonlyMap<string, Float32Array>, denseGrads: ReadonlyMap<string, Float32Array>,
    ids: ArrayLike<number> | null, rowValues: ReadonlyMap<string, Float32Array> | null, rowGrads: ReadonlyMap<string, Float32Array> | null, lrScale: number): boolean {
    for (const g of denseGrads.values()) if (firstNonFinite(g) >= 0) return false;
    if (rowGrads !== null) for (const g of rowGrads.values()) if (firstNonFinite(g) >= 0) return false;
    const step = ++this.steps;
    for (const [name, param] of dense) {
      const grad = denseGrads.get(name);
      if (grad === undefined || grad.length !== param.length) continue;
      let state = this.denseState.get(name);
      if (state === undefined) { state = this.dense.allocateState(param.length); this.denseState.set(name, state); }
      this.dense.updateDenseChecked(param, grad, state, step, lrScale, name);
    }
    if (this.sparse === null || ids === null || ids.length === 0 || rowValues === null || rowGrads === null) return true;
    for (const [name, grads] of rowGrads) {
      const values = rowValues.get(name);
      if (values === undefined || values.length !== grads.length || grads.length % ids.length !== 0) continue;
      let t = this.tables.get(name);
      if (t === undefined) { t = new LocalRows(this.sparse, grads.length / ids.length); this.tables.set(name, t); }
      t.step(ids, values, grads, this.window, step, lrScale);
    }
    return true;
  }
}
