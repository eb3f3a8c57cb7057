/**
 * How a worker's step talks to the shards, as plain functions over the shard
 * plan: which shard gets which pull, how the replies are put together into
 * the dense parameters and the batch's rows, and how the step's gradients
 * are cut back into one push per shard. No I/O here (`ShardClient` sends),
 * so the routing is unit-tested without a bus.
 */
import { InvalidTensorError } from '../../runtime/mod.ts';
import { denseBlocksByShard, splitIdsByShard, type DenseBlock, type ShardPlan, type SparseTableSpec } from '../../topology/mod.ts';
import type { PullReply, PullRequest, PushRequest } from '../shard/shard.messages.ts';

/** One shard's share of a step. */
export interface ShardExchange {
  shard: string;
  /** Dense blocks this shard owns that the step pulls (and pushes). */
  blocks: DenseBlock[];
  /** The batch's unique ids this shard owns, and their positions among the batch's unique ids. */
  ids: Int32Array<ArrayBuffer>;
  positions: Int32Array;
}

const NO_IDS = new Int32Array(0);

/**
 * The shards a step talks to. `dense`: pull every dense block (a training
 * step needs the whole model). `allShards`: include shards with nothing to
 * exchange (a synchronous round needs a contribution from every worker at
 * every shard).
 */
export function planExchange(plan: ShardPlan, uniqueIds: Int32Array | null, opts: { dense: boolean; allShards: boolean }): ShardExchange[] {
  const blocks = opts.dense ? denseBlocksByShard(plan) : null;
  const split = uniqueIds !== null && uniqueIds.length > 0 && plan.sparseTables.length > 0 ? splitIdsByShard(plan, uniqueIds) : null;
  const out: ShardExchange[] = [];
  for (const shard of plan.shards) {
    const b = blocks?.get(shard) ?? [];
    const part = split?.get(shard) ?? null;
    if (!opts.allShards && b.length === 0 && part === null) continue;
    out.push({ shard, blocks: b, ids: (part?.ids ?? NO_IDS) as Int32Array<ArrayBuffer>, positions: part?.positions ?? NO_IDS });
  }
  return out;
}

export function pullRequest(plan: ShardPlan, ex: ShardExchange, tables: readonly SparseTableSpec[], minRound: number | null): PullRequest {
  return {
    plan_version: plan.version,
    dense: Int32Array.from(ex.blocks, (b) => b.id),
    sparse: ex.ids.length ? tables.map((t) => ({ table: t.name, ids: ex.ids })) : [],
    min_round: minRound,
    // The worker's stepper asks for fp16 where it compresses (communication.compress_pulls).
    compression: null,
  };
}

/**
 * Writes the pull replies into `dense` (whole parameters by name, allocated
 * by the caller) and into one `[U, dim]` array per table (returned), where U
 * is the number of unique ids of the step.
 */
export function assemblePull(
  exchanges: readonly ShardExchange[], replies: readonly PullReply[], tables: readonly SparseTableSpec[],
  dense: Map<string, Float32Array>, uniqueCount: number,
): Map<string, Float32Array> {
  const rows = new Map(tables.map((t) => [t.name, new Float32Array(uniqueCount * t.dim)]));
  exchanges.forEach((ex, s) => {
    const r = replies[s]!;
    if (r.dense.length !== ex.blocks.length) throw new InvalidTensorError(`shard ${ex.shard} answered ${r.dense.length} dense blocks for ${ex.blocks.length} asked`);
    ex.blocks.forEach((b, k) => {
      const target = dense.get(b.param);
      const v = r.dense[k]!;
      if (target === undefined) throw new InvalidTensorError(`dense block ${b.id} is of unknown parameter ${b.param}`);
      if (v.length !== b.length) throw new InvalidTensorError(`shard ${ex.shard} sent ${v.length} values for dense block ${b.id} of ${b.length}`);
      target.set(v, b.offset);
    });
    if (ex.ids.length === 0) return;
    if (r.sparse.length !== tables.length) throw new InvalidTensorError(`shard ${ex.shard} answered ${r.sparse.length} sparse tables for ${tables.length} asked`);
    tables.forEach((t, k) => {
      const got = r.sparse[k]!;
      const out = rows.get(t.name)!;
      const d = t.dim;
      if (got.length !== ex.ids.length * d) throw new InvalidTensorError(`shard ${ex.shard} sent ${got.length} floats of table ${t.name} for ${ex.ids.length} ids of dim ${d}`);
      for (let j = 0; j < ex.positions.length; j++) {
        const to = ex.positions[j]! * d;
        const from = j * d;
        for (let c = 0; c < d; c++) out[to + c] = got[from + c]!;
      }
    });
  });
  return rows;
}

export interface PushMeta {
  round: number | null;
  expected: number | null;
  weight: number;
  baseVersion: number;
  /** The batch ids the push carries (the shards' applied log); default none. */
  batches?: readonly string[];
}

/**
 * One shard's push: the gradient slice of each of its blocks and, per table,
 * its ids with their gradient rows. `denseGrads` / `rowGrads` null: an empty
 * contribution (bsp round without a batch).
 */
export function pushRequest(
  plan: ShardPlan, ex: ShardExchange, tables: readonly SparseTableSpec[],
  denseGrads: ReadonlyMap<string, Float32Array> | null, rowGrads: ReadonlyMap<string, Float32Array> | null, meta: PushMeta,
): PushRequest {
  const dense: PushRequest['dense'] = [];
  if (denseGrads !== null) {
    for (const b of ex.blocks) {
      const g = denseGrads.get(b.param);
      if (g === undefined) throw new InvalidTensorError(`no gradient for dense parameter ${b.param}`);
      dense.push({ block: b.id, grad: g.subarray(b.offset, b.offset + b.length) as Float32Array<ArrayBuffer> });
    }
  }
  const sparse: PushRequest['sparse'] = [];
  if (rowGrads !== null && ex.ids.length > 0) {
    for (const t of tables) {
      const all = rowGrads.get(t.name);
      if (all === undefined) throw new InvalidTensorError(`no gradient rows for table ${t.name}`);
      const d = t.dim;
      const grads = new Float32Array(ex.ids.length * d);
      for (let j = 0; j < ex.positions.length; j++) {
        const from = ex.positions[j]! * d;
        for (let c = 0; c < d; c++) grads[j * d + c] = all[from + c]!;
      }
      sparse.push({ table: t.name, ids: ex.ids, grads });
    }
  }
  return {
    plan_version: plan.version, round: meta.round, expected: meta.expected, weight: meta.weight, base_version: meta.baseVersion, later_steps: [], lr_mult: 1,
    dense, sparse, batches: [...(meta.batches ?? [])],
  };
}

/** Whole dense parameters, zero-filled, sized by the plan. */
export function allocateDense(plan: ShardPlan): Map<string, Float32Array> {
  return new Map(plan.denseParams.map((p) => [p.name, new Float32Array(p.size)]));
}
