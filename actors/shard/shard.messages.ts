/**
 * The shard's protocol: what workers (and the scheduler) send to
 * `hps.<job>.shard.<shard>.<op>`. Every push carries (from, seq) in its
 * envelope and is applied exactly once, also when retried.
 *
 * Versions: a shard's `version` counts the updates it has applied. In
 * asynchronous mode each push is one update; in synchronous (bsp) mode a
 * round is one update, applied when `expected` contributions of that round
 * have arrived (weighted by their sample counts).
 *
 * Staleness = shard version at the push − the push's `base_version` (the
 * version its gradient was computed from), i.e. how many updates other
 * senders applied to this shard meanwhile. In hps one update is one group
 * step index of a `sync`/`adaptive` group's window (its member owning this
 * shard pushes the group's reduced window once per sync, as one update per
 * step index: `later_steps`), one window of an `accumulation` group (the union of
 * its members' batches, one update), or one step of an `async` group member
 * — so staleness 3 means three updates of other groups (or members) landed
 * on this shard since the group pulled. With a staleness policy (hps) the shard applies a push at
 * lr / (1 + staleness) and refuses one staler than `max_staleness` with
 * StaleUpdateError.
 */
import { z } from 'zod';
import { zf32, zi32, zu16 } from '../../runtime/mod.ts';
import { compressGradient, decompressGradient, FP16_MAX_EXP, type SparseTableSnapshot } from '../../native-bridge/mod.ts';
import { snapshotHeadSchema, snapshotSegmentSchema } from './snapshot-segments.ts';

/**
 * A gradient tensor: float32, or scaled halves `{ f16, exp }` when the
 * sender compresses (communication.compression: fp16;
 * native-bridge/fp16.ts). Decoded to float32 on arrival, so every receiver
 * (shard, backup, group member) sees float32 whatever the sender chose.
 */
export const zGradient = () => z.union([
  zf32(),
  z.strictObject({ f16: zu16(), exp: z.number().int().gt(-FP16_MAX_EXP).lt(FP16_MAX_EXP) }),
], { error: `must be a Float32Array, or a compressed gradient { f16: Uint16Array, exp: an integer with |exp| < ${FP16_MAX_EXP} } and nothing else` }).transform((g): Float32Array<ArrayBuffer> => (g instanceof Float32Array ? g as Float32Array<ArrayBuffer> : decompressGradient(g as { f16: Uint16Array<ArrayBuffer>; exp: number })));

const sparseIds = z.object({ table: z.string().min(1), ids: zi32() });
const sparseGrads = z.object({ table: z.string().min(1), ids: zi32(), grads: zGradient() });
const denseGrad = z.object({ block: z.number().int().nonnegative(), grad: zGradient() });

/** Gradient tensors as pushes and group slices carry them, before compression. */
export interface GradientTensors {
  dense: { block: number; grad: Float32Array<ArrayBuffer> }[];
  sparse: { table: string; ids: Int32Array<ArrayBuffer>; grads: Float32Array<ArrayBuffer> }[];
}
/** The same on the wire: each gradient float32 or compressed. */
export interface WireGradientTensors {
  dense: { block: number; grad: z.input<ReturnType<typeof zGradient>> }[];
  sparse: { table: string; ids: Int32Array<ArrayBuffer>; grads: z.input<ReturnType<typeof zGradient>> }[];
}

/** `t` with every gradient compressed where compressGradient finds it worth it (communication.compression: fp16). */
export function compressTensors(t: GradientTensors): WireGradientTensors {
  return {
    dense: t.dense.map((d) => ({ block: d.block, grad: compressGradient(d.grad) })),
    sparse: t.sparse.map((s) => ({ table: s.table, ids: s.ids, grads: compressGradient(s.grads) })),
  };
}

/** Bytes of the tensors' payload as sent (ids and gradients; halves count 2 bytes). */
export function wireTensorBytes(t: WireGradientTensors): number {
  let n = 0;
  for (const d of t.dense) n += wireGradientBytes(d.grad);
  for (const s of t.sparse) n += s.ids.byteLength + wireGradientBytes(s.grads);
  return n;
}

/** Bytes of one tensor as sent: float32, or halves at 2 bytes an element. */
function wireGradientBytes(g: z.input<ReturnType<typeof zGradient>>): number {
  return g instanceof Float32Array ? g.byteLength : (g as { f16: Uint16Array }).f16.byteLength;
}

export const shardMessages = {
  /**
   * Dense blocks (by plan block id) and sparse rows (created on first pull).
   * `min_round`: answer only once synchronous round `min_round - 1` has been
   * applied (a deferred reply); null answers at once.
   */
  pull: z.object({
    plan_version: z.number().int().nonnegative(),
    dense: zi32(),
    sparse: z.array(sparseIds),
    min_round: z.number().int().nonnegative().nullable(),
    /**
     * `fp16`: answer with the tensors as scaled halves (`{ f16, exp }`, as a
     * compressed gradient; communication.compress_pulls), float32 where
     * compressGradient keeps them so (short, all-zero); null: float32.
     */
    compression: z.enum(['fp16']).nullable().default(null),
  }),
  /**
   * Gradients. `round` null: apply now (async). Otherwise a contribution to a
   * synchronous round that needs `expected` contributions; `weight` is the
   * batch's sample count (0 = "no batch this round", still counted).
   * `base_version`: the shard version the gradients were computed from (for
   * staleness accounting).
   */
  push: z.object({
    plan_version: z.number().int().nonnegative(),
    round: z.number().int().nonnegative().nullable(),
    expected: z.number().int().positive().nullable(),
    weight: z.number().nonnegative(),
    base_version: z.number().int().nonnegative(),
    dense: z.array(denseGrad),
    sparse: z.array(sparseGrads),
    /**
     * Further optimizer steps applied right after this one, in order, each
     * one update (version + 1) at the same learning-rate scale (staleness is
     * judged once, on arrival). A fixed-step (`sync`) or `adaptive` group
     * pushes its window as one step per step index of its members (the
     * k-th step of every member, averaged), so a window of N steps is N
     * updates, not one. Async pushes only.
     */
    later_steps: z.array(z.object({ dense: z.array(denseGrad), sparse: z.array(sparseGrads) })).default([]),
    /**
     * hps: the learning-rate multiplier of a group's update, which averages
     * several members' batches (training.group_lr_scaling,
     * topology/group-lr.ts); it multiplies the staleness scale. Async pushes
     * only; 1 for everything else.
     */
    lr_mult: z.number().positive().max(1024).default(1),
    /**
     * The ids of the batches whose gradients this push carries (a group
     * window carries its members' batches). A shard keeps the log of the
     * batches it applied, for the end-of-run integrity check; a push whose
     * every batch this shard already applied (a batch trained again after its
     * worker died before acknowledging it) is answered without applying it again.
     */
    batches: z.array(z.string().min(1)).default([]),
  }),
  /** Everything the shard holds, for checkpoints (and, later, replication and migration). */
  snapshot: z.object({}),
  /**
   * A checkpoint's cut: copies everything the shard holds now, in memory,
   * under `token` (replacing any copy before it), and answers at once with
   * the version and round; `take_frozen` fetches the copy later, once
   * training goes on. Keeps the pause for the cut to an in-memory copy.
   */
  freeze: z.object({ token: z.string().min(1) }),
  /**
   * The copy `freeze` made under `token`, handed over once and dropped:
   * without `segment_bytes` the whole ShardSnapshot in the reply (it must
   * fit communication.max_message_bytes); with it `{ head, segments }` (and
   * a replica's `dedup`, `applied`, `refused`), its arrays to be taken with
   * `take_frozen_part`, each segment at most `segment_bytes`.
   */
  take_frozen: z.object({ token: z.string().min(1), segment_bytes: z.number().int().min(256).optional() }),
  /** Segment `index` (0, 1, … in order, each once) of the copy `take_frozen` split: `{ segment }`. */
  take_frozen_part: z.object({ token: z.string().min(1), index: z.number().int().nonnegative() }),
  /**
   * `checkpoint.written_by: shards`: the copy of the cut `token` written by
   * the shard itself as its checkpoint files into `dir` (a checkpoint's
   * temporary directory, an absolute path on storage the driver sees at the
   * same path), handed over once: `{ files: [{ name, bytes, sha256, shard,
   * version, round }], rows, dense_optimizer, sparse_optimizer }`.
   */
  /**
   * A resume read by the shard itself (`checkpoint.written_by: shards`): its
   * files of the checkpoint at `path` (absolute, on storage it sees at the same
   * path; its delta chain applied, each file checked), restored as `restore`
   * restores a state.
   */
  restore_files: z.object({ path: z.string().min(1).refine((d) => d.startsWith('/'), { error: 'must be an absolute path' }) }),
  write_frozen: z.object({
    token: z.string().min(1),
    dir: z.string().min(1).refine((d) => d.startsWith('/'), { error: 'must be an absolute path' }),
    part_bytes: z.number().int().min(1024).optional(),
    /** The checkpoint's name, for the shard to build later deltas on (absent: a checkpoint outside the chain). */
    name: z.string().min(1).optional(),
    /** A delta on this checkpoint of the chain (the one before it); the shard writes a full file when it did not write that one. */
    base: z.string().min(1).nullable().optional(),
  }),
  /** A restore in segments begins: the state's layout (`head`), `segments` parts to follow; replaces one in progress. */
  restore_begin: z.object({ transfer: z.string().min(1), head: snapshotHeadSchema, segments: z.number().int().nonnegative() }),
  /** Segment `index` (in order) of the restore `transfer`. */
  restore_part: z.object({ transfer: z.string().min(1), index: z.number().int().nonnegative(), segment: snapshotSegmentSchema }),
  /**
   * Replaces the shard's state: with `state`, a whole snapshot; with
   * `transfer`, the one `restore_begin` and `restore_part` brought, and the
   * replica's logs at the cut (`dedup`, `applied`, `refused`). All or nothing.
   */
  restore: z.object({
    state: z.record(z.string(), z.unknown()).optional(),
    transfer: z.string().min(1).optional(),
    dedup: z.array(z.lazy(() => dedupWindowSchema)).optional(),
    applied: z.array(z.tuple([z.string(), z.number().int().positive()])).optional(),
    refused: z.array(z.string()).optional(),
  }).refine((m) => (m.state === undefined) !== (m.transfer === undefined), { error: 'give either state (a whole snapshot) or transfer (one sent with restore_begin and restore_part), not both' }),
  /** Counters for monitoring and tests. */
  stats: z.object({}),
  /**
   * Lowers the contributions synchronous round `round` waits for to
   * `expected` (bsp: a worker was declared dead while the others wait for the
   * round). Ignored for a round already applied, or when the round already
   * expects fewer.
   */
  round_expected: z.object({
    plan_version: z.number().int().nonnegative(),
    round: z.number().int().nonnegative(),
    expected: z.number().int().positive(),
  }),
};
export type ShardMessages = typeof shardMessages;

const pushSchema = shardMessages.push;
const pushReplySchema = z.object({
  version: z.number().int().nonnegative(), applied: z.boolean(), staleness: z.number().int().nonnegative(), lr_scale: z.number(),
  // Embedding rows' multiplier when training.staleness_tolerance gives them their own; absent from older primaries: lr_scale.
  sparse_lr_scale: z.number().optional(),
  // The part left out as past its kind's bound (training.max_staleness { dense, sparse }); absent: nothing left out.
  dropped: z.enum(['dense', 'sparse']).optional(),
});

/**
 * One update in a primary's replication stream, numbered `rseq` (1, 2, …
 * per primary and backup). `push`: applied with the primary's `lr_scale`,
 * and `(from, seq)` → `reply` recorded in the backup's dedup table, so a
 * retry reaching this replica once promoted is answered, not applied again.
 * `refused`: a push the primary refused as too stale (counted, batches logged).
 * `round_expected`: `push.round` now waits for `push.expected` contributions.
 */
export const replicationEntrySchema = z.object({
  rseq: z.number().int().positive(),
  kind: z.enum(['push', 'refused', 'round_expected']),
  from: z.string().min(1),
  seq: z.number().int().nonnegative(),
  push: pushSchema,
  lr_scale: z.number(),
  /** The embedding rows' multiplier; absent (an older primary): lr_scale. */
  sparse_lr_scale: z.number().optional(),
  reply: pushReplySchema.nullable(),
});
export type ReplicationEntry = z.output<typeof replicationEntrySchema>;

/** One sender's recent `(seq → reply)` pairs: the dedup table travels with a seed. */
export const dedupWindowSchema = z.object({
  from: z.string().min(1),
  evicted_up_to: z.number().int(),
  seqs: z.array(z.number().int().nonnegative()),
  replies: z.array(pushReplySchema),
});
export type DedupWindowWire = z.output<typeof dedupWindowSchema>;

/**
 * A replica of a shard on one server node (`hps.<job>.shard.<shard>@<node>.<op>`):
 * the shard's messages, served while it is the primary, plus what its
 * primary sends it while it is a backup.
 */
export const replicaMessages = {
  ...shardMessages,
  /**
   * Updates from the primary, in `rseq` order. `epoch`: the plan version the
   * primary serves; a replica under a newer plan refuses it (FencedError: the
   * sender was deposed), one under an older plan asks it to retry
   * (StalePlanError). Entries at or below what the replica applied are
   * skipped; the reply says how far it has applied (`applied_to`).
   */
  replicate: z.object({
    epoch: z.number().int().nonnegative(),
    primary: z.string().min(1),
    entries: z.array(replicationEntrySchema),
  }),
  /**
   * A seed begins: the layout of the primary's state (its snapshot without
   * the arrays, snapshot-segments.ts) and how many `seed_part`s follow. A
   * later `seed_begin` replaces a seed in progress.
   */
  seed_begin: z.object({
    epoch: z.number().int().nonnegative(),
    primary: z.string().min(1),
    transfer: z.string().min(1),
    head: snapshotHeadSchema,
    segments: z.number().int().nonnegative(),
  }),
  /** Segment `index` (0, 1, … in order) of the seed `transfer`: element ranges of dense blocks, row ranges of sparse tables. */
  seed_part: z.object({
    epoch: z.number().int().nonnegative(),
    primary: z.string().min(1),
    transfer: z.string().min(1),
    index: z.number().int().nonnegative(),
    segment: snapshotSegmentSchema,
  }),
  /**
   * Chunk `index` (0, 1, … in order) of the seed's logs, after its segments
   * and before its last message: logs over the message limit (every batch id
   * applied, the dedup windows, open rounds' contributions) go in chunks that
   * each fit; the last chunk rides in `seed`. A sender's dedup window may be
   * cut across chunks (the replica joins it again).
   */
  seed_logs: z.object({
    epoch: z.number().int().nonnegative(),
    primary: z.string().min(1),
    transfer: z.string().min(1),
    index: z.number().int().nonnegative(),
    dedup: z.array(dedupWindowSchema),
    applied: z.array(z.tuple([z.string(), z.number().int().positive()])),
    refused: z.array(z.string()),
    open_rounds: z.array(replicationEntrySchema),
  }),
  /**
   * The seed's last message, after its segments: the primary's state as of
   * update `base_rseq` is the one `transfer` carried; with it come its dedup
   * table, its applied-batch log and the contributions to still-open
   * synchronous rounds (their last chunk, after any `seed_logs`). The replica restores it all at once (all or
   * nothing), then the stream continues from `base_rseq + 1`.
   */
  seed: z.object({
    epoch: z.number().int().nonnegative(),
    primary: z.string().min(1),
    base_rseq: z.number().int().nonnegative(),
    transfer: z.string().min(1),
    dedup: z.array(dedupWindowSchema),
    applied: z.array(z.tuple([z.string(), z.number().int().positive()])),
    refused: z.array(z.string()),
    open_rounds: z.array(replicationEntrySchema),
  }),
  /**
   * The end-of-run check: the batches applied (with counts), those refused as
   * stale, and the state hash. `paged`: the applied-batch log comes inline
   * only when it fits one message; otherwise `applied` is empty and the reply
   * names `applied_token` and how many `integrity_part`s hold the log.
   */
  integrity: z.object({ paged: z.boolean().optional() }),
  /** Part `index` (0, 1, …) of a paged integrity reply's applied-batch log: `{ applied: [[batch_id, count]] }`; the copy is dropped after the last. */
  integrity_part: z.object({ token: z.string().min(1), index: z.number().int().nonnegative() }),
};
export type ReplicaMessages = typeof replicaMessages;

export interface ReplicateReply { applied_to: number }

export interface IntegrityReply {
  shard: string;
  node: string;
  role: string;
  epoch: number;
  version: number;
  hash: string;
  /** Batch id → times applied (more than 1 is a duplicate). */
  applied: Record<string, number>;
  refused: string[];
  /** Updates applied but not yet confirmed by every backup (async replication: what a failover could lose). */
  unreplicated: number;
  /** A paged reply whose log did not fit one message: `applied` is empty, the log is in `applied_parts` parts under this token. */
  applied_token?: string;
  applied_parts?: number;
}
export type PullRequest = z.output<typeof shardMessages.pull>;
export type PushRequest = z.output<typeof shardMessages.push>;
export type RestoreRequest = z.output<typeof shardMessages.restore>;
/** A push as sent: gradients may be compressed (decoded to `PushRequest` on arrival). */
export type PushWire = z.input<typeof shardMessages.push>;

/** `req` with its gradients (and its later steps') compressed (communication.compression: fp16). */
export function compressPush(req: PushRequest): PushWire {
  return { ...req, ...compressTensors(req), later_steps: req.later_steps.map((l) => compressTensors(l)) };
}

export interface PullReply {
  version: number;
  /** Synchronous rounds applied so far. */
  round: number;
  /** One array per requested block, in request order. */
  dense: Float32Array[];
  /** One array per requested table, `ids.length × dim` rows in request order. */
  sparse: Float32Array[];
  /** Where the reply came compressed (a pull with `compression`): its tensor bytes as sent, halves at 2 bytes. */
  wireBytes?: number;
}

/** A pull's reply as sent when the pull asked for `compression` (decoded to float32 by the worker's ShardClient). */
export const pullReplyWire = z.object({
  version: z.number().int().nonnegative(),
  round: z.number().int().nonnegative(),
  dense: z.array(zGradient()),
  sparse: z.array(zGradient()),
});
export type PullReplyWire = z.input<typeof pullReplyWire>;

/** `reply` with its tensors as scaled halves where compressGradient finds it worth it (a pull with `compression: fp16`). */
export function compressPullReply(reply: PullReply): PullReplyWire {
  const c = (t: Float32Array) => compressGradient(t as Float32Array<ArrayBuffer>);
  return { version: reply.version, round: reply.round, dense: reply.dense.map(c), sparse: reply.sparse.map(c) };
}

/** Tensor bytes of a pull reply as sent (halves count 2 bytes). */
export function pullReplyWireBytes(reply: PullReplyWire): number {
  let n = 0;
  for (const d of reply.dense) n += wireGradientBytes(d);
  for (const s of reply.sparse) n += wireGradientBytes(s);
  return n;
}

export interface PushReply {
  version: number;
  /** True when the gradients were applied by this push (async) or completed the round (sync). */
  applied: boolean;
  /** Shard version minus `base_version` at the time of the push. */
  staleness: number;
  /** Learning-rate multiplier the push's dense blocks were applied with (1 / (1 + staleness) under the hps policy; 1 otherwise). */
  lr_scale: number;
  /** Its embedding rows' multiplier (the same as `lr_scale` unless training.staleness_tolerance gives rows their own). */
  sparse_lr_scale?: number;
  /** The part of the push not applied as staler than its kind's bound (training.max_staleness { dense, sparse }); absent: all of it applied. */
  dropped?: 'dense' | 'sparse';
}

/** One dense block in a snapshot, with its optimizer state. */
export interface DenseBlockSnapshot {
  id: number;
  param: string;
  offset: number;
  length: number;
  values: Float32Array;
  /** One array per optimizer state slot, each `length` long. */
  state: Float32Array[];
  /** Updates applied to this block. */
  step: number;
}

/**
 * Everything a shard holds (the `snapshot` reply; the `state` of `restore`).
 * Open synchronous rounds are not included: take snapshots between rounds.
 */
export interface ShardSnapshot {
  format: 1;
  shard: string;
  plan_version: number;
  version: number;
  round: number;
  dense_optimizer: string;
  sparse_optimizer: string;
  dense: DenseBlockSnapshot[];
  sparse: SparseTableSnapshot[];
  /**
   * The replica's `(from, seq)` dedup table at the cut (checkpoints; absent
   * from a plain snapshot and from checkpoints written before it was kept):
   * a restore puts it back, so a push applied before the cut and retried
   * after the restore is answered from it, not applied twice.
   */
  dedup?: DedupWindowWire[];
  /** The replica's log of applied batch ids (id → times) and of those refused as too stale, at the cut (checkpoints only). */
  applied?: [string, number][];
  refused?: string[];
}

export interface RestoreReply {
  version: number;
  round: number;
}

/**
 * Staleness (shard version minus the push's `base_version`) of the pushes
 * received, in power-of-two buckets: `counts[i]` counts values ≤ `le[i]`
 * (and above `le[i - 1]`); the last entry of `counts` counts values above
 * the last bound.
 */
export interface StalenessHistogram {
  le: number[];
  counts: number[];
  count: number;
  sum: number;
  max: number;
}

export interface ShardStats {
  shard: string;
  plan_version: number;
  version: number;
  round: number;
  pushes: number;
  pulls: number;
  /** Floats this replica's pulls returned (dense values, embedding rows). */
  pulled_floats: number;
  /** Gradient floats it took: pushes (every step of each), or on a backup the replicated stream. */
  pushed_floats: number;
  duplicates: number;
  sparse_rows: Record<string, number>;
  dense_blocks: number;
  bytes: number;
  /** Pulls waiting (deferred) for a synchronous round to complete. */
  waiting_pulls: number;
  /** Contributions received so far to synchronous rounds not yet applied. */
  pending_contributions: number;
  /** Staleness of every push received (refused ones included). */
  staleness: StalenessHistogram;
  /** The policy's bound (hps; the dense blocks' where each kind has its own); null: staleness is only measured. */
  max_staleness: number | null;
  /** The embedding rows' bound (the same as `max_staleness` unless training.max_staleness is { dense, sparse }). */
  sparse_max_staleness: number | null;
  /** Async pushes refused as staler than `max_staleness` (StaleUpdateError). */
  stale_refused: number;
  /** Async pushes applied at a reduced learning rate (staleness > 0 under the policy). */
  stale_scaled: number;
  /** Admitted async pushes whose dense part was dropped as beyond the dense bound (their rows applied). */
  stale_dense_dropped: number;
  /** Admitted async pushes whose rows were dropped as beyond the rows' bound (their dense part applied). */
  stale_sparse_dropped: number;
  /** Time spent applying updates (optimizer steps), in milliseconds. */
  apply_ms: number;
}
