/**
 * Delta checkpoints (checkpoint.full_every > 1): between full checkpoints a
 * shard's file holds its dense blocks (they change with every step) and only
 * the sparse rows updated since the previous checkpoint of the chain. A row's
 * per-row update count (`steps`, advanced by every optimizer update of it)
 * tells whether it changed; a row never updated is the deterministic
 * initial row and is never written.
 *
 * Plain functions over snapshots: `rowSteps` records what a checkpoint
 * wrote, `deltaOf` keeps the rows that changed since, and `overlay` applies
 * a chain (full, then each delta in order) back into one snapshot to restore.
 */
import type { ShardSnapshot } from '../shard/shard.messages.ts';
import { IdIndex, type SparseTableSnapshot } from '../../native-bridge/mod.ts';

/** Per table, per row id, its update count as of a checkpoint (an `IdIndex`: a table's rows outnumber what a JS Map holds). */
export type RowSteps = Map<string, IdIndex>;

/** The update count of every row of `snap`. */
export function rowSteps(snap: ShardSnapshot): RowSteps {
  const out: RowSteps = new Map();
  for (const t of snap.sparse) {
    const m = new IdIndex(t.ids.length);
    for (let k = 0; k < t.ids.length; k++) m.set(t.ids[k]!, t.steps[k]! | 0);
    out.set(t.table, m);
  }
  return out;
}

/** Rows of `t` at positions `keep`, as a table snapshot of their own. */
function pick(t: SparseTableSnapshot, keep: readonly number[]): SparseTableSnapshot {
  const d = t.dim;
  const sd = d * t.stateSlots;
  const ids = new Uint32Array(keep.length);
  const values = new Float32Array(keep.length * d);
  const state = new Float32Array(keep.length * sd);
  const steps = new Uint32Array(keep.length);
  keep.forEach((k, j) => {
    ids[j] = t.ids[k]!;
    values.set(t.values.subarray(k * d, k * d + d), j * d);
    if (sd) state.set(t.state.subarray(k * sd, k * sd + sd), j * sd);
    steps[j] = t.steps[k]!;
  });
  return { table: t.table, dim: d, stateSlots: t.stateSlots, ids, values, state, steps };
}

/**
 * `snap` with only the sparse rows whose update count differs from `before`
 * (new rows updated at least once included); dense blocks, version and round
 * as they are. Also updates `before` to `snap`'s counts.
 */
export function deltaOf(snap: ShardSnapshot, before: RowSteps): { delta: ShardSnapshot; rows: number; of: number } {
  let rows = 0;
  let of = 0;
  const sparse = snap.sparse.map((t) => {
    let prev = before.get(t.table);
    if (prev === undefined) { prev = new IdIndex(t.ids.length); before.set(t.table, prev); }
    const keep: number[] = [];
    for (let k = 0; k < t.ids.length; k++) {
      const id = t.ids[k]!;
      const s = t.steps[k]! | 0;
      if (s !== prev.get(id, 0)) { keep.push(k); prev.set(id, s); }
    }
    rows += keep.length;
    of += t.ids.length;
    return pick(t, keep);
  });
  return { delta: { ...snap, sparse }, rows, of };
}

/**
 * A chain applied in order: the first is a full snapshot, each later one a
 * delta of the same shard. Dense blocks, version and round come from the
 * last; sparse rows are the full one's overwritten by each delta's.
 */
export function overlay(chain: readonly ShardSnapshot[]): ShardSnapshot {
  if (chain.length === 0) throw new RangeError('overlay: an empty chain');
  const last = chain[chain.length - 1]!;
  for (const s of chain) {
    if (s.shard !== last.shard) throw new RangeError(`overlay: shard ${s.shard} in a chain of ${last.shard}`);
  }
  if (chain.length === 1) return last;
  // Per table, the parts in chain order; a row's last writer wins.
  const tables = new Map<string, SparseTableSnapshot[]>();
  for (const snap of chain) {
    for (const t of snap.sparse) {
      let parts = tables.get(t.table);
      if (parts === undefined) { parts = []; tables.set(t.table, parts); }
      parts.push(t);
    }
  }
  const sparse = [...tables.values()].map((parts) => {
    const t = parts[0]!;
    const d = t.dim;
    const sd = d * t.stateSlots;
    // Output row of each id, in first-seen order (ids are unique within one part).
    const at = new IdIndex(parts.reduce((a, p) => Math.max(a, p.ids.length), 0));
    let n = 0;
    for (const p of parts) for (let k = 0; k < p.ids.length; k++) if (at.get(p.ids[k]!) < 0) at.set(p.ids[k]!, n++);
    const out: SparseTableSnapshot = {
      table: t.table, dim: d, stateSlots: t.stateSlots,
      ids: new Uint32Array(n), values: new Float32Array(n * d), state: new Float32Array(n * sd), steps: new Uint32Array(n),
    };
    for (const src of parts) {
      for (let k = 0; k < src.ids.length; k++) {
        const j = at.get(src.ids[k]!);
        out.ids[j] = src.ids[k]!;
        out.values.set(src.values.subarray(k * d, k * d + d), j * d);
        if (sd) out.state.set(src.state.subarray(k * sd, k * sd + sd), j * sd);
        out.steps[j] = src.steps[k]!;
      }
    }
    return out;
  });
  return { ...last, sparse };
}
