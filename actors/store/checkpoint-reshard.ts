/**
 * Re-sharding a checkpoint for a resume onto another layout: another number
 * of servers, or dense blocks cut differently (a smaller max_payload). The
 * checkpoint's state is put back together per dense parameter (values and
 * optimizer state) and per sparse table (rows with their state and update
 * counts), then cut along the new plan: each new dense block takes its slice
 * (its update count: the largest of the old blocks it overlaps, so Adam's
 * bias correction never goes back), each row goes to the shard owning its
 * partition in the new plan. Every new shard starts at the largest version
 * and round of the old ones, so versions only grow.
 */
import { denseBlocksByShard, partitionOf, type ShardPlan } from '../../topology/mod.ts';
import type { DedupWindowWire, DenseBlockSnapshot, ShardSnapshot } from '../shard/shard.messages.ts';
import type { SparseTableSnapshot } from '../../native-bridge/mod.ts';
import { ValidationError } from '../../runtime/mod.ts';
import { CheckpointError, type ResumePoint } from './checkpoint.ts';

/** Whether `snapshots` can be restored onto `plan` as they are: the same shards, each with exactly its blocks and only rows of its partitions. */
export function layoutMatches(snapshots: ReadonlyMap<string, ShardSnapshot>, plan: ShardPlan): boolean {
  if (!sameShards([...snapshots.keys()], plan)) return false;
  for (const [shard, snap] of snapshots) if (!shardLayoutMatches(shard, snap, plan)) return false;
  return true;
}

/** Whether a checkpoint holding state of `shards` has exactly the shards of `plan`. */
export function sameShards(shards: readonly string[], plan: ShardPlan): boolean {
  return JSON.stringify([...shards].sort()) === JSON.stringify([...plan.shards].sort());
}

/** Whether one shard's snapshot can be restored onto `shard` of `plan` as it is: exactly its blocks, and only rows of its partitions. */
export function shardLayoutMatches(shard: string, snap: ShardSnapshot, plan: ShardPlan): boolean {
  const blocks = denseBlocksByShard(plan).get(shard);
  if (blocks === undefined) return false;
  const want = blocks.map((b) => `${b.id}:${b.param}:${b.offset}:${b.length}`).sort();
  const have = snap.dense.map((b) => `${b.id}:${b.param}:${b.offset}:${b.length}`).sort();
  if (JSON.stringify(want) !== JSON.stringify(have)) return false;
  for (const t of snap.sparse) {
    for (const id of t.ids) if (plan.partitionOwner[partitionOf(id, plan.partitions)] !== shard) return false;
  }
  return true;
}

/** One dense parameter put back together from the blocks of every shard. */
export interface DenseWhole {
  values: Float32Array;
  /** Optimizer state slots, each as long as `values`. */
  state: Float32Array[];
  /** Each block's span and update count. */
  steps: { offset: number; length: number; step: number }[];
}

/**
 * Every parameter of `params` whole again from the shards' dense blocks
 * (values and optimizer state); `fail` is called (and must throw) naming a
 * block of a parameter not in `params`, a block that does not fit, or a
 * parameter some of whose values no shard holds.
 */
export function wholeDense(snaps: readonly ShardSnapshot[], params: readonly { name: string; size: number }[], fail: (what: string) => never): Map<string, DenseWhole> {
  const dense = new Map<string, DenseWhole>(params.map((p) => [p.name, { values: new Float32Array(p.size), state: [], steps: [] }]));
  const covered = new Map(params.map((p) => [p.name, 0]));
  for (const s of snaps) {
    for (const b of s.dense) {
      const w = dense.get(b.param) ?? fail(`dense parameter ${b.param} of shard ${s.shard} is not in the model`);
      if (b.offset + b.length > w.values.length || b.values.length !== b.length) {
        fail(`block ${b.id} of ${b.param} (offset ${b.offset}, ${b.length} values) does not fit its ${w.values.length} values: the model changed`);
      }
      w.values.set(b.values, b.offset);
      b.state.forEach((st, k) => { (w.state[k] ??= new Float32Array(w.values.length)).set(st, b.offset); });
      w.steps.push({ offset: b.offset, length: b.length, step: b.step });
      covered.set(b.param, covered.get(b.param)! + b.length);
    }
  }
  for (const [name, w] of dense) {
    if (covered.get(name) !== w.values.length) fail(`the shards hold ${covered.get(name)} of the ${w.values.length} values of dense parameter ${name}; a shard file is missing`);
  }
  return dense;
}

/** `snapshots` (one per old shard) cut along `plan`: one snapshot per shard of the plan. Throws CheckpointError naming what does not fit. */
export function reshard(snapshots: ReadonlyMap<string, ShardSnapshot>, plan: ShardPlan, path: string): Map<string, ShardSnapshot> {
  const snaps = [...snapshots.values()];
  const first = snaps[0];
  if (first === undefined) throw new CheckpointError(`checkpoint ${path} holds no shard state`, path, []);
  const fail = (what: string): never => { throw new CheckpointError(`checkpoint ${path} cannot be re-sharded onto plan v${plan.version} (${plan.shards.join(', ')}): ${what}`, path, []); };

  for (const s of snaps) {
    if (s.dense_optimizer !== first.dense_optimizer || s.sparse_optimizer !== first.sparse_optimizer) fail(`shards ${first.shard} and ${s.shard} use different optimizers`);
  }
  const dense = wholeDense(snaps, plan.denseParams, fail);

  // Sparse: every row to its new owner.
  const tableSpecs = new Map(plan.sparseTables.map((t) => [t.name, t]));
  const rowsOf = new Map<string, SparseTableSnapshot[]>();
  for (const s of snaps) {
    for (const t of s.sparse) {
      const spec = tableSpecs.get(t.table) ?? fail(`sparse table ${t.table} is not in the plan`);
      if (spec.dim !== t.dim) fail(`sparse table ${t.table} has rows of ${t.dim}, the plan ${spec.dim}`);
      let a = rowsOf.get(t.table);
      if (a === undefined) { a = []; rowsOf.set(t.table, a); }
      a.push(t);
    }
  }

  // Every old shard's dedup table goes to every new one: a sender's seq numbers are its own across shards, so they never collide.
  const dedup = snaps.flatMap((s) => s.dedup ?? []);
  // Each dense-owning shard logged every batch once: the new shards' log is the union (a batch's count: its most on any old shard).
  const applied = new Map<string, number>();
  for (const s of snaps) for (const [b, n] of s.applied ?? []) applied.set(b, Math.max(n, applied.get(b) ?? 0));
  const refused = [...new Set(snaps.flatMap((s) => s.refused ?? []))];
  const logs = snaps.some((s) => s.applied !== undefined) ? { applied: [...applied], refused } : {};
  const version = Math.max(...snaps.map((s) => s.version));
  const round = Math.max(...snaps.map((s) => s.round));
  const blocks = denseBlocksByShard(plan);
  const out = new Map<string, ShardSnapshot>();
  for (const shard of plan.shards) {
    const myBlocks: DenseBlockSnapshot[] = blocks.get(shard)!.map((b) => {
      const w = dense.get(b.param)!;
      const end = b.offset + b.length;
      const step = Math.max(0, ...w.steps.filter((o) => o.offset < end && b.offset < o.offset + o.length).map((o) => o.step));
      return { id: b.id, param: b.param, offset: b.offset, length: b.length, values: w.values.slice(b.offset, end), state: w.state.map((st) => st.slice(b.offset, end)), step };
    });
    out.set(shard, {
      format: 1, shard, plan_version: plan.version, version, round, dense_optimizer: first.dense_optimizer, sparse_optimizer: first.sparse_optimizer,
      dense: myBlocks, sparse: [], ...(dedup.length ? { dedup: mergeDedup(dedup) } : {}), ...logs,
    });
  }
  for (const [table, parts] of rowsOf) {
    const { dim, stateSlots } = parts[0]!;
    const sd = dim * stateSlots;
    const owner = (id: number) => plan.partitionOwner[partitionOf(id, plan.partitions)]!;
    const counts = new Map(plan.shards.map((s) => [s, 0]));
    for (const p of parts) {
      if (p.stateSlots !== stateSlots) fail(`sparse table ${table} has ${p.stateSlots} and ${stateSlots} state slots on different shards`);
      for (const id of p.ids) counts.set(owner(id), counts.get(owner(id))! + 1);
    }
    const built = new Map(plan.shards.map((s) => {
      const n = counts.get(s)!;
      return [s, { table, dim, stateSlots, ids: new Uint32Array(n), values: new Float32Array(n * dim), state: new Float32Array(n * sd), steps: new Uint32Array(n), at: 0 }];
    }));
    for (const p of parts) {
      for (let k = 0; k < p.ids.length; k++) {
        const t = built.get(owner(p.ids[k]!))!;
        const j = t.at++;
        t.ids[j] = p.ids[k]!;
        t.values.set(p.values.subarray(k * dim, k * dim + dim), j * dim);
        if (sd) t.state.set(p.state.subarray(k * sd, k * sd + sd), j * sd);
        t.steps[j] = p.steps[k]!;
      }
    }
    for (const [shard, { at: _at, ...t }] of built) out.get(shard)!.sparse.push(t);
  }
  return out;
}

/** One window per sender: the windows of several shards for the same sender, merged. */
function mergeDedup(windows: readonly DedupWindowWire[]): DedupWindowWire[] {
  const by = new Map<string, { evicted: number; replies: Map<number, DedupWindowWire['replies'][number]> }>();
  for (const w of windows) {
    let m = by.get(w.from);
    if (m === undefined) { m = { evicted: w.evicted_up_to, replies: new Map() }; by.set(w.from, m); }
    m.evicted = Math.max(m.evicted, w.evicted_up_to);
    w.seqs.forEach((seq, i) => m!.replies.set(seq, w.replies[i]!));
  }
  return [...by].map(([from, m]) => {
    const seqs = [...m.replies.keys()].sort((a, b) => a - b);
    return { from, evicted_up_to: m.evicted, seqs, replies: seqs.map((q) => m.replies.get(q)!) };
  });
}

/** What `restoreOntoPlan` did, for the driver's output. */
export type RestoreEvent =
  | { kind: 'restored'; shard: string; version: number; by: 'driver' | 'shard' }
  | { kind: 'reshard'; reason: string; from: string[]; rows: { shard: string; rows: number }[]; dense_blocks: number };

const rowsOf = (snap: ShardSnapshot): number => snap.sparse.reduce((k, t) => k + t.ids.length, 0);

/**
 * A resume's state onto the shards of `plan`, through `restore` (one shard
 * at a time). A checkpoint of the same layout is read and restored one shard
 * at a time, so the caller holds one shard's state at once. A checkpoint of
 * another layout (other shards, blocks cut otherwise, rows of partitions
 * another shard owns now) is read whole and re-sharded first; should that be
 * found only at a later shard, the shards already restored are restored
 * again from the re-sharded state (a restore replaces a shard's whole state).
 * Throws CheckpointError when re-sharding loses a row: nothing is restored then.
 *
 * With `restoreFiles` (checkpoint.written_by: shards: storage every server
 * reaches) the shards read their own files instead, all at once, and the
 * state does not cross the network; should one refuse its state as laid
 * out for another plan (a ValidationError), the checkpoint is read whole and
 * re-sharded here as above; any other failure fails the resume.
 */
export async function restoreOntoPlan(
  resume: Pick<ResumePoint, 'path' | 'manifest' | 'shards' | 'readShard' | 'readAll'>, plan: ShardPlan,
  restore: (shard: string, snap: ShardSnapshot) => Promise<{ version: number }>, on: (e: RestoreEvent) => void,
  restoreFiles?: (shard: string) => Promise<{ version: number }>,
): Promise<void> {
  const restored: string[] = [];
  // `said` false: restored, but to be restored again from here, so not reported.
  const done = (shard: string, version: number, by: 'driver' | 'shard', said = true) => { restored.push(shard); if (said) on({ kind: 'restored', shard, version, by }); };
  // Why the checkpoint must be re-sharded here, or null when every shard is restored as it is.
  const misfit = !sameShards(resume.shards, plan)
    ? `the checkpoint holds shards ${resume.shards.join(', ')}, plan v${plan.version} has ${plan.shards.join(', ')}`
    : restoreFiles !== undefined ? await restoredByShards(plan, restoreFiles, done) : await restoredOneByOne(resume, plan, restore, done);
  if (misfit === null) return;
  const old = await resume.readAll();
  const snapshots = reshard(old, plan, resume.path);
  const before = [...old.values()].reduce((n, s) => n + rowsOf(s), 0);
  const after = [...snapshots.values()].reduce((n, s) => n + rowsOf(s), 0);
  if (after !== before) throw new CheckpointError(`--resume: re-sharding ${resume.path} lost rows (${before} → ${after}); `
    + (restored.length === 0 ? 'nothing was restored' : `the resume stops with ${restored.join(', ')} restored from the checkpoint as they were`), resume.path, []);
  on({ kind: 'reshard', reason: misfit, from: [...old.keys()], rows: [...snapshots].map(([shard, s]) => ({ shard, rows: rowsOf(s) })), dense_blocks: plan.dense.length });
  old.clear();
  for (const shard of plan.shards) done(shard, (await restore(shard, snapshots.get(shard)!)).version, 'driver');
}

/** Each shard reads its own files, all at once; null when all are restored, else why one refused (another failure is thrown). */
async function restoredByShards(
  plan: ShardPlan, restoreFiles: (shard: string) => Promise<{ version: number }>, done: (shard: string, version: number, by: 'shard', said: boolean) => void,
): Promise<string | null> {
  const results = await Promise.allSettled(plan.shards.map((shard) => restoreFiles(shard)));
  const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected' && !(r.reason instanceof ValidationError));
  if (failed !== undefined) throw failed.reason;
  const refused = results.findIndex((r) => r.status === 'rejected');
  // Reported only when every shard took its files: otherwise all are restored again from here.
  results.forEach((r, i) => { if (r.status === 'fulfilled') done(plan.shards[i]!, r.value.version, 'shard', refused < 0); });
  return refused < 0 ? null : `shard ${plan.shards[refused]} refused its files: ${((results[refused] as PromiseRejectedResult).reason as Error).message}`;
}

/** Each shard read here and restored before the next is read; null when all fit the plan, else which did not (those before it are restored). */
async function restoredOneByOne(
  resume: Pick<ResumePoint, 'readShard'>, plan: ShardPlan, restore: (shard: string, snap: ShardSnapshot) => Promise<{ version: number }>,
  done: (shard: string, version: number, by: 'driver') => void,
): Promise<string | null> {
  for (const shard of plan.shards) {
    const snap = await resume.readShard(shard);
    if (!shardLayoutMatches(shard, snap, plan)) return `shard ${shard}'s blocks or rows are laid out otherwise than in plan v${plan.version}`;
    done(shard, (await restore(shard, snap)).version, 'driver');
  }
  return null;
}
