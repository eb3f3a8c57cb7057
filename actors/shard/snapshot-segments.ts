/**
 * A shard's state in segments: a snapshot too big for one message
 * (communication.max_message_bytes, at most 4 GiB — one Node Buffer) goes as
 * a head (the layout, without the arrays) and segments that each fit a byte
 * budget; the receiver allocates the arrays from the head and fills them
 * segment by segment. Dense blocks are cut into element ranges and sparse
 * tables into row ranges, so no single block or table has to fit.
 *
 * Segments are views on the snapshot's arrays (nothing is copied to send
 * them); the assembler copies each into the arrays it allocated, so a
 * segment's message can go as soon as it is added.
 */
import { z } from 'zod';
import { ValidationError, zf32, zu32 } from '../../runtime/mod.ts';
import type { DenseBlockSnapshot, ShardSnapshot } from './shard.messages.ts';
import type { SparseTableSnapshot } from '../../native-bridge/mod.ts';

/** The snapshot's fields without its arrays: what the receiver allocates them from. */
export type SnapshotHead = Omit<ShardSnapshot, 'dense' | 'sparse' | 'dedup' | 'applied' | 'refused'> & {
  dense: { id: number; param: string; offset: number; length: number; slots: number; step: number }[];
  sparse: { table: string; dim: number; stateSlots: number; rows: number }[];
};

/** Part of the arrays: elements `[from, from + values.length)` of a dense block, rows `[from, from + ids.length)` of a table. */
export interface SnapshotSegment {
  dense: { id: number; from: number; values: Float32Array; state: Float32Array[] }[];
  sparse: { table: string; from: number; ids: Uint32Array; values: Float32Array; state: Float32Array; steps: Uint32Array }[];
}

/** The fields of a shard snapshot besides its blocks, tables and logs (shared with shard.actor.ts' snapshot schema). */
export const snapshotFields = {
  format: z.literal(1),
  shard: z.string(),
  plan_version: z.number().int().nonnegative(),
  version: z.number().int().nonnegative(),
  round: z.number().int().nonnegative(),
  dense_optimizer: z.string(),
  sparse_optimizer: z.string(),
};

export const snapshotHeadSchema = z.object({
  ...snapshotFields,
  dense: z.array(z.object({
    id: z.number().int().nonnegative(), param: z.string(), offset: z.number().int().nonnegative(),
    length: z.number().int().positive(), slots: z.number().int().nonnegative(), step: z.number().int().nonnegative(),
  })),
  sparse: z.array(z.object({
    table: z.string(), dim: z.number().int().positive(), stateSlots: z.number().int().nonnegative(), rows: z.number().int().nonnegative(),
  })),
});

export const snapshotSegmentSchema = z.object({
  dense: z.array(z.object({ id: z.number().int().nonnegative(), from: z.number().int().nonnegative(), values: zf32(), state: z.array(zf32()) })),
  sparse: z.array(z.object({
    table: z.string(), from: z.number().int().nonnegative(), ids: zu32(), values: zf32(), state: zf32(), steps: zu32(),
  })),
});

/** Bytes a piece of a segment costs besides its arrays (its keys and array headers, generously). */
const PIECE_OVERHEAD = 128;

/** The largest segment for a message limit: the limit less room for the envelope and the message's other fields. */
export function segmentBudget(maxMessageBytes: number, cap = 64 * 1024 * 1024): number {
  const limit = Math.min(maxMessageBytes, cap);
  return Math.max(256, limit - Math.min(64 * 1024, Math.floor(limit / 4)));
}

/**
 * Splits `snap` into its head and segments of at most `budget` bytes of
 * arrays and piece overhead each (a piece holds at least one element or
 * row, so a budget below one row's bytes still makes progress, a row a
 * segment). Segments are views on `snap`'s arrays.
 */
export function splitSnapshot(snap: ShardSnapshot, budget: number): { head: SnapshotHead; segments: SnapshotSegment[] } {
  const head: SnapshotHead = {
    format: 1, shard: snap.shard, plan_version: snap.plan_version, version: snap.version, round: snap.round,
    dense_optimizer: snap.dense_optimizer, sparse_optimizer: snap.sparse_optimizer,
    dense: snap.dense.map((d) => ({ id: d.id, param: d.param, offset: d.offset, length: d.length, slots: d.state.length, step: d.step })),
    sparse: snap.sparse.map((s) => ({ table: s.table, dim: s.dim, stateSlots: s.stateSlots, rows: s.ids.length })),
  };
  const segments: SnapshotSegment[] = [];
  let cur: SnapshotSegment = { dense: [], sparse: [] };
  let used = 0;
  const close = () => {
    if (cur.dense.length || cur.sparse.length) segments.push(cur);
    cur = { dense: [], sparse: [] };
    used = 0;
  };
  /** How many of `left` units (each `unit` bytes) fit what is left of this segment; a fresh segment takes at least one. */
  const take = (left: number, unit: number): number => {
    let n = Math.min(left, Math.floor((budget - used - PIECE_OVERHEAD) / unit));
    if (n <= 0 && used > 0) { close(); n = Math.min(left, Math.floor((budget - PIECE_OVERHEAD) / unit)); }
    return Math.max(1, n);
  };
  for (const d of snap.dense) {
    const unit = 4 * (1 + d.state.length);
    for (let from = 0; from < d.length;) {
      const n = take(d.length - from, unit);
      cur.dense.push({ id: d.id, from, values: d.values.subarray(from, from + n), state: d.state.map((s) => s.subarray(from, from + n)) });
      used += PIECE_OVERHEAD + n * unit;
      from += n;
    }
  }
  for (const s of snap.sparse) {
    const rowFloats = s.dim, stateFloats = s.dim * s.stateSlots;
    const unit = 8 + 4 * (rowFloats + stateFloats);
    const rows = s.ids.length;
    for (let from = 0; from < rows;) {
      const n = take(rows - from, unit);
      cur.sparse.push({
        table: s.table, from, ids: s.ids.subarray(from, from + n), values: s.values.subarray(from * rowFloats, (from + n) * rowFloats),
        state: s.state.subarray(from * stateFloats, (from + n) * stateFloats), steps: s.steps.subarray(from, from + n),
      });
      used += PIECE_OVERHEAD + n * unit;
      from += n;
    }
  }
  close();
  return { head, segments };
}

/** Bytes of a segment's arrays and pieces, as splitSnapshot counts them against its budget. */
export function segmentBytes(seg: SnapshotSegment): number {
  let n = 0;
  for (const p of seg.dense) n += PIECE_OVERHEAD + p.values.byteLength + p.state.reduce((a, s) => a + s.byteLength, 0);
  for (const p of seg.sparse) n += PIECE_OVERHEAD + p.ids.byteLength + p.values.byteLength + p.state.byteLength + p.steps.byteLength;
  return n;
}

/**
 * Rebuilds a snapshot from its head and segments, in the order they were
 * split (each piece must start where the previous one of its block or
 * table ended). Every mismatch is a ValidationError naming it; `finish`
 * says what is still missing.
 */
export class SnapshotAssembler {
  private readonly dense = new Map<number, { d: DenseBlockSnapshot; filled: number }>();
  private readonly sparse = new Map<string, { s: SparseTableSnapshot; filled: number }>();
  segments = 0;

  constructor(readonly head: SnapshotHead, private readonly what: string) {
    for (const d of head.dense) {
      if (this.dense.has(d.id)) this.fail(`dense block ${d.id} appears twice in the head`);
      this.dense.set(d.id, {
        d: { id: d.id, param: d.param, offset: d.offset, length: d.length, values: new Float32Array(d.length), state: Array.from({ length: d.slots }, () => new Float32Array(d.length)), step: d.step },
        filled: 0,
      });
    }
    for (const s of head.sparse) {
      if (this.sparse.has(s.table)) this.fail(`sparse table ${s.table} appears twice in the head`);
      this.sparse.set(s.table, {
        s: {
          table: s.table, dim: s.dim, stateSlots: s.stateSlots, ids: new Uint32Array(s.rows), values: new Float32Array(s.rows * s.dim),
          state: new Float32Array(s.rows * s.dim * s.stateSlots), steps: new Uint32Array(s.rows),
        },
        filled: 0,
      });
    }
  }

  private fail(why: string): never {
    throw new ValidationError(`${this.what}: ${why}`);
  }

  add(seg: SnapshotSegment): void {
    const n = this.segments + 1;
    for (const p of seg.dense) {
      const b = this.dense.get(p.id);
      if (b === undefined) this.fail(`segment ${n} has dense block ${p.id}, which the head does not list`);
      const len = p.values.length;
      if (p.from !== b.filled) this.fail(`segment ${n}: dense block ${p.id} continues at element ${p.from}, expected ${b.filled}`);
      if (b.filled + len > b.d.length) this.fail(`segment ${n}: dense block ${p.id} gets elements up to ${b.filled + len} of ${b.d.length}`);
      if (p.state.length !== b.d.state.length || p.state.some((s) => s.length !== len)) {
        this.fail(`segment ${n}: dense block ${p.id} has ${p.state.length} state slot(s) of ${p.state.map((s) => s.length).join('/')} elements for ${b.d.state.length} of ${len}`);
      }
      b.d.values.set(p.values, b.filled);
      p.state.forEach((s, k) => b.d.state[k]!.set(s, b.filled));
      b.filled += len;
    }
    for (const p of seg.sparse) {
      const t = this.sparse.get(p.table);
      if (t === undefined) this.fail(`segment ${n} has sparse table ${p.table}, which the head does not list`);
      const rows = p.ids.length, dim = t.s.dim, slots = t.s.stateSlots;
      if (p.from !== t.filled) this.fail(`segment ${n}: sparse table ${p.table} continues at row ${p.from}, expected ${t.filled}`);
      if (t.filled + rows > t.s.ids.length) this.fail(`segment ${n}: sparse table ${p.table} gets rows up to ${t.filled + rows} of ${t.s.ids.length}`);
      if (p.values.length !== rows * dim || p.state.length !== rows * dim * slots || p.steps.length !== rows) {
        this.fail(`segment ${n}: sparse table ${p.table}: ${rows} rows with ${p.values.length} values, ${p.state.length} state floats and ${p.steps.length} steps do not match dim ${dim}`);
      }
      t.s.ids.set(p.ids, t.filled);
      t.s.values.set(p.values, t.filled * dim);
      t.s.state.set(p.state, t.filled * dim * slots);
      t.s.steps.set(p.steps, t.filled);
      t.filled += rows;
    }
    this.segments = n;
  }

  /** The whole snapshot; a ValidationError naming the first block or table not filled. */
  finish(): ShardSnapshot {
    for (const b of this.dense.values()) if (b.filled !== b.d.length) this.fail(`dense block ${b.d.id} has ${b.filled} of ${b.d.length} elements after ${this.segments} segment(s)`);
    for (const t of this.sparse.values()) if (t.filled !== t.s.ids.length) this.fail(`sparse table ${t.s.table} has ${t.filled} of ${t.s.ids.length} rows after ${this.segments} segment(s)`);
    const h = this.head;
    return {
      format: 1, shard: h.shard, plan_version: h.plan_version, version: h.version, round: h.round,
      dense_optimizer: h.dense_optimizer, sparse_optimizer: h.sparse_optimizer,
      dense: [...this.dense.values()].map((b) => b.d), sparse: [...this.sparse.values()].map((t) => t.s),
    };
  }
}

/**
 * A snapshot arriving in segments on a shard (a seed, a restore): `begin`
 * with its head, `part` in order, `finish` once every part came. One at a
 * time: a later `begin` replaces one in progress. Errors are
 * ValidationErrors saying the sender should start over.
 */
export class IncomingSnapshot {
  private t: { transfer: string; segments: number; asm: SnapshotAssembler } | null = null;

  /** `what`: the receiver and the kind of transfer, for errors ("shard s0: seed"). */
  constructor(private readonly what: string) {}

  begin(transfer: string, head: SnapshotHead, segments: number, shard: string, from: string): void {
    this.t = null;
    if (head.shard !== shard) throw new ValidationError(`${this.what} ${transfer} from ${from} holds shard ${head.shard}, not ${shard}`);
    this.t = { transfer, segments, asm: new SnapshotAssembler(head, `${this.what} ${transfer} from ${from}`) };
  }

  part(transfer: string, index: number, segment: SnapshotSegment): number {
    const t = this.current(transfer);
    if (index !== t.asm.segments) throw new ValidationError(`${this.what} ${transfer}: segment ${index} arrived where ${t.asm.segments} was expected; start it over`);
    if (index >= t.segments) throw new ValidationError(`${this.what} ${transfer}: segment ${index}, of ${t.segments} announced`);
    t.asm.add(segment);
    return t.asm.segments;
  }

  /** The whole snapshot, once every announced segment came; the transfer is over either way. */
  finish(transfer: string): ShardSnapshot {
    const t = this.current(transfer);
    this.t = null;
    if (t.asm.segments !== t.segments) throw new ValidationError(`${this.what} ${transfer} ended after ${t.asm.segments} of ${t.segments} segments; start it over`);
    return t.asm.finish();
  }

  private current(transfer: string): { transfer: string; segments: number; asm: SnapshotAssembler } {
    const t = this.t;
    if (t === null || t.transfer !== transfer) {
      throw new ValidationError(`${this.what} ${transfer} is not in progress${t === null ? '' : ` (${t.transfer} is)`}: the receiver restarted, or a later one replaced it; start it over`);
    }
    return t;
  }
}

/** A snapshot handed out in segments (a checkpoint's frozen copy): taken in order, once; dropped after the last. */
export class OutgoingSnapshot {
  private o: { token: string; segments: SnapshotSegment[]; next: number } | null = null;

  constructor(private readonly what: string) {}

  /** Splits `snap` to `budget` and holds its segments under `token` (replacing any held); returns the head and how many. */
  hold(token: string, snap: ShardSnapshot, budget: number): { head: SnapshotHead; segments: number } {
    const { head, segments } = splitSnapshot(snap, budget);
    this.o = segments.length > 0 ? { token, segments, next: 0 } : null;
    return { head, segments: segments.length };
  }

  take(token: string, index: number): SnapshotSegment {
    const o = this.o;
    if (o === null || o.token !== token) {
      throw new ValidationError(`${this.what}: no segments held under ${token}${o === null ? '' : ` (they are ${o.token}'s)`}: a later cut replaced them, or they were taken already; take the checkpoint again`);
    }
    if (index !== o.next) throw new ValidationError(`${this.what}: segment ${index} of ${token} asked where ${o.next} is next; take the checkpoint again`);
    o.next++;
    if (o.next === o.segments.length) this.o = null;
    return o.segments[index]!;
  }
}
