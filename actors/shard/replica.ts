/**
 * One replica of a shard on one server node, at
 * `hps.<job>.shard.<shard>@<node>`: the primary serves pulls and pushes and
 * streams every update to its backups; a backup applies that stream.
 *
 * - **Sync replication** (default): the primary applies an update, appends it
 *   to each backup's stream, and answers the pusher only once every backup
 *   of the plan has applied it. An acknowledged update is on every replica.
 *   `async`: it answers at once, and waits only when a backup lags more than
 *   `lagLimit` updates (what a failover could lose, reported by `integrity`).
 * - **Dedup travels with the state.** Every replica keeps the `(from, seq) →
 *   reply` table of the pushes it applied (the primary's replies, streamed),
 *   so a retry that reaches a promoted backup is answered, never applied again.
 *   A retry arriving while the first attempt still waits for its backups
 *   joins it.
 * - **Fencing.** A replica serves only under the newest plan it knows; a
 *   primary whose backup refuses its stream (the backup follows a newer plan
 *   naming another primary) is deposed: it answers everything with
 *   StalePlanError (clients re-read the plan) and applies nothing more.
 * - **Seeding** (re-replication, and later live migration): a new replica
 *   gets the primary's snapshot as of stream position `base_rseq`, then the
 *   stream from there; once it has caught up the primary asks the scheduler
 *   to make it a backup, and from that plan on it is waited for.
 * - **Applied-batch log.** Each replica counts the batch ids it applied, for
 *   the end-of-run integrity check; a push whose every batch it already
 *   applied (a batch trained again after its worker died unacknowledged) is
 *   answered without applying it again.
 */
import { performance } from 'node:perf_hooks';
import {
  DeferredReply, HetpsError, PayloadTooLargeError, ValidationError, isRetryable, type ActorDefinition, type ActorSystem, type Logger, type Timer,
} from '../../runtime/mod.ts';
import { replicaNodes, type ReplicaRole, type ShardPlan } from '../../topology/mod.ts';
import type { ShardState, WrittenShard } from './shard.actor.ts';
import { readShardFromCheckpoint } from '../store/checkpoint.ts';
import {
  replicaMessages, type DedupWindowWire, type IntegrityReply, type PushReply, type PushRequest, type ReplicaMessages,
  type ReplicateReply, type ReplicationEntry, type RestoreRequest, type ShardSnapshot, wireTensorBytes,
} from './shard.messages.ts';
import { FencedError, StalePlanError, StaleUpdateError } from './shard.errors.ts';
import { IncomingSnapshot, segmentBudget, segmentBytes, splitSnapshot, type SnapshotHead, type SnapshotSegment } from './snapshot-segments.ts';

/** A seed's last message: where the stream continues, the transfer that carried the state, and the replica's logs. */
export interface SeedMessage {
  epoch: number;
  primary: string;
  base_rseq: number;
  transfer: string;
  dedup: DedupWindowWire[];
  applied: [string, number][];
  refused: string[];
  open_rounds: ReplicationEntry[];
}

/** A seed's logs: its dedup table, applied-batch log, refused batches and open rounds' contributions. */
export type SeedLogs = Pick<SeedMessage, 'dedup' | 'applied' | 'refused' | 'open_rounds'>;

/** Bytes one dedup reply and its seq take in a message, at most (its fields all present). */
const DEDUP_PAIR_BYTES = 128;
const utf8Bytes = (s: string): number => Buffer.byteLength(s, 'utf8');

/**
 * A seed's logs cut into chunks of at most `budget` bytes each (about: each
 * item's size is bounded from above), in order: the dedup windows (a
 * sender's window may be cut across chunks by its seqs), the applied-batch
 * log, the refused batches, the open rounds' contributions. One item larger
 * than the budget (a batch id, a contribution) goes alone in a chunk; the
 * message carrying it is then refused as over the limit. Always at least one
 * chunk. `mergeSeedLogs` puts them back together.
 */
export function splitSeedLogs(logs: SeedLogs, budget: number): SeedLogs[] {
  const chunks: SeedLogs[] = [];
  let cur: SeedLogs = { dedup: [], applied: [], refused: [], open_rounds: [] };
  let bytes = 0;
  const room = (n: number): void => {
    if (bytes > 0 && bytes + n > budget) {
      chunks.push(cur);
      cur = { dedup: [], applied: [], refused: [], open_rounds: [] };
      bytes = 0;
    }
    bytes += n;
  };
  for (const w of logs.dedup) {
    const head = 64 + utf8Bytes(w.from);
    let from = 0;
    do {
      room(head + (w.seqs.length > from ? DEDUP_PAIR_BYTES : 0));
      // As many pairs as the chunk has room for (at least one, so that it makes progress).
      const fit = Math.max(1, Math.floor((budget - bytes) / DEDUP_PAIR_BYTES) + 1);
      const to = Math.min(w.seqs.length, from + fit);
      bytes += (to - from - 1) * DEDUP_PAIR_BYTES;
      cur.dedup.push({ from: w.from, evicted_up_to: w.evicted_up_to, seqs: w.seqs.slice(from, to), replies: w.replies.slice(from, to) });
      from = to;
    } while (from < w.seqs.length);
  }
  for (const a of logs.applied) { room(16 + utf8Bytes(a[0])); cur.applied.push(a); }
  for (const b of logs.refused) { room(8 + utf8Bytes(b)); cur.refused.push(b); }
  for (const e of logs.open_rounds) { room(entryBytes(e)); cur.open_rounds.push(e); }
  chunks.push(cur);
  return chunks;
}

/** The chunks of `splitSeedLogs` as one: a sender's window cut across chunks is one window again. */
export function mergeSeedLogs(chunks: readonly SeedLogs[]): SeedLogs {
  const windows = new Map<string, DedupWindowWire>();
  const out: SeedLogs = { dedup: [], applied: [], refused: [], open_rounds: [] };
  for (const c of chunks) {
    for (const w of c.dedup) {
      const have = windows.get(w.from);
      if (have === undefined) {
        const copy = { from: w.from, evicted_up_to: w.evicted_up_to, seqs: [...w.seqs], replies: [...w.replies] };
        windows.set(w.from, copy);
        out.dedup.push(copy);
      } else {
        have.evicted_up_to = Math.max(have.evicted_up_to, w.evicted_up_to);
        for (const x of w.seqs) have.seqs.push(x);
        for (const r of w.replies) have.replies.push(r);
      }
    }
    for (const a of c.applied) out.applied.push(a);
    for (const b of c.refused) out.refused.push(b);
    for (const e of c.open_rounds) out.open_rounds.push(e);
  }
  return out;
}

/** The actor id of `shard`'s replica on `node`. */
export function replicaId(shard: string, node: string): string {
  return `${shard}@${node}`;
}

/** The actor id of `shard`'s primary under `plan`. */
export function primaryReplicaId(plan: ShardPlan, shard: string): string {
  const r = plan.placement.replicas[shard];
  if (r === undefined) throw new HetpsError(`shard ${shard} is not placed in shard plan v${plan.version}`);
  return replicaId(shard, r.primary);
}

export interface ReplicaOptions {
  shard: string;
  node: string;
  state: ShardState;
  system: ActorSystem;
  log: Logger;
  replication: 'sync' | 'async';
  /** async: the most updates a backup may lag before the primary waits. */
  lagLimit: number;
  /** A seeding backup has caught up: ask the scheduler to make it a backup. */
  onCaughtUp: (shard: string, node: string, epoch: number) => Promise<void>;
  /** A backup this primary cannot seed (`why`): ask the scheduler to make it seeding again. */
  onUnseedable: (shard: string, node: string, epoch: number, why: string) => Promise<void>;
  /** Per replication request; default 1000 ms. */
  requestTimeoutMs?: number;
  /** How long this server process's event loop has been busy so far (ms), for load balancing's measured capacity; default `loopBusyMs`. */
  busyMs?: () => number;
}

/**
 * How long this process's event loop has been busy so far (ms; Node's event
 * loop utilization, `active`): the time its replicas' work took, which grows
 * both with the CPU that work costs on this machine and with contention for
 * the machine's CPU (unlike the process's CPU time).
 */
export function loopBusyMs(): number {
  return performance.eventLoopUtilization().active;
}

// ---------------------------------------------------------------- dedup

const DEDUP_WINDOW = 10_000;

interface DedupWindow { replies: Map<number, PushReply>; evictedUpTo: number }

/** `(from, seq) → reply` of the pushes a replica applied, a window per sender. */
export class DedupTable {
  private windows = new Map<string, DedupWindow>();

  /** The reply already sent, 'evicted' when the pair is older than the window, null when never applied. */
  get(from: string, seq: number): PushReply | 'evicted' | null {
    const w = this.windows.get(from);
    if (w === undefined) return null;
    const r = w.replies.get(seq);
    if (r !== undefined) return r;
    return seq <= w.evictedUpTo ? 'evicted' : null;
  }

  record(from: string, seq: number, reply: PushReply): void {
    let w = this.windows.get(from);
    if (w === undefined) { w = { replies: new Map(), evictedUpTo: -1 }; this.windows.set(from, w); }
    w.replies.set(seq, reply);
    while (w.replies.size > DEDUP_WINDOW) {
      const oldest = w.replies.keys().next().value as number;
      w.replies.delete(oldest);
      if (oldest > w.evictedUpTo) w.evictedUpTo = oldest;
    }
  }

  export(): DedupWindowWire[] {
    return [...this.windows].map(([from, w]) => ({ from, evicted_up_to: w.evictedUpTo, seqs: [...w.replies.keys()], replies: [...w.replies.values()] }));
  }

  import(wire: readonly DedupWindowWire[]): void {
    this.windows = new Map(wire.map((d) => [d.from, { evictedUpTo: d.evicted_up_to, replies: new Map(d.seqs.map((s, i) => [s, d.replies[i]!])) }]));
  }
}

// ---------------------------------------------------------------- the primary's stream to one backup

interface Waiter { rseq: number; resolve: () => void; reject: (e: Error) => void }

const MAX_ENTRIES_PER_MESSAGE = 64;
/** A seed or update over communication.max_message_bytes is tried again this seldom (it fits only once the limit is raised). */
const TOO_LARGE_RETRY_MS = 30_000;
/** Updates a backup keeps after applying them (what a failover's other backups may lack is what was in flight: a few per client). */
const RETAINED_ENTRIES = 256;

/**
 * The primary's stream of updates to one other replica. Entries stay until
 * that replica confirms them (`applied_to`); a lost reply, a timeout or a gap
 * re-sends from the first unconfirmed one (the replica skips what it has).
 */
class ReplicationLink {
  private entries: ReplicationEntry[] = [];
  private ackedTo: number;
  private sentTo: number;
  private waiters: Waiter[] = [];
  private flushTimer: Timer | null = null;
  private flushing = false;
  private attempt = 0;
  private closed = false;
  private seeded: boolean;
  /** Counts `reseed`s: a seed sent before the latest one carried a state the primary no longer holds. */
  private seedGeneration = 0;
  private reportedCaughtUp = false;
  /**
   * Its seed does not fit communication.max_message_bytes (a restarted
   * backup of a shard whose state outgrew the limit): it holds no copy, so
   * pushes do not wait for it (they would wait for as long as the job runs)
   * until a seed gets through.
   */
  private unseedable = false;
  /**
   * A seeded replica closing in on the stream: the stream's position when it
   * was at most a message behind. From then on pushes wait for it as for a
   * backup, so once it confirms that position it holds every acknowledged
   * update and is reported caught up. (Waiting for a moment with nothing
   * unconfirmed instead never came under a steady stream of pushes: the
   * shard stayed unprotected until training quieted.)
   */
  private closingInAt: number | null = null;
  private readonly ref;

  /**
   * `retained`: updates of the stream this replica may still lack (a backup
   * kept by a failover: the entries the promoted one applied last); they are
   * sent first, and a replica they cannot catch up is seeded.
   */
  constructor(private readonly r: Replica, readonly node: string, public gating: boolean, baseRseq: number, seedFirst: boolean, retained: readonly ReplicationEntry[] = []) {
    const from = retained.length > 0 ? Math.min(baseRseq, retained[0]!.rseq - 1) : baseRseq;
    this.ackedTo = from;
    this.sentTo = from;
    this.entries = retained.filter((e) => e.rseq <= baseRseq);
    this.seeded = !seedFirst;
    this.ref = r.o.system.ref('shard', replicaId(r.o.shard, node));
    if (seedFirst || this.entries.length > 0) this.schedule(0);
  }

  /** Updates not yet confirmed by this replica. */
  get lag(): number { return this.entries.length; }

  /** Pushes wait for this replica: a backup, or a seeded replica closing in on the stream. */
  get holdsPushes(): boolean { return (this.gating || this.closingInAt !== null) && !this.unseedable; }

  append(e: ReplicationEntry): void {
    this.entries.push(e);
    if (!this.flushTimer && !this.flushing) this.schedule(0);
  }

  /** Resolves once the replica applied update `rseq` (or at once when the link is closed). */
  waitFor(rseq: number): Promise<void> {
    if (this.ackedTo >= rseq || this.closed) return Promise.resolve();
    return new Promise((resolve, reject) => this.waiters.push({ rseq, resolve, reject }));
  }

  /** The replica left the plan: nobody waits for it any more. */
  close(): void {
    this.closed = true;
    this.flushTimer?.cancel();
    this.flushTimer = null;
    this.releaseWaiters();
  }

  /** Answers every push waiting for this replica: it no longer holds them. */
  private releaseWaiters(): void {
    const w = this.waiters;
    this.waiters = [];
    for (const x of w) x.resolve();
  }

  /** This primary was deposed: every waiting push fails (its client re-reads the plan). */
  fail(e: Error): void {
    this.closed = true;
    this.flushTimer?.cancel();
    const w = this.waiters;
    this.waiters = [];
    for (const x of w) x.reject(e);
  }

  /**
   * Starts over with a new seed (a restore replaced the primary's state, or
   * the replica lacks updates the stream no longer holds). The seed holds
   * every update up to its position, so the entries go; the pushes waiting
   * for any of them are answered once the seed is confirmed (`ack`). (Moving
   * `ackedTo` here instead stranded them until some later update was
   * confirmed — never, in a job whose every worker waited on one of them.)
   */
  reseed(): void {
    this.seeded = false;
    this.seedGeneration++;
    this.entries = [];
    this.sentTo = this.ackedTo;
    this.schedule(0);
  }

  private schedule(ms: number): void {
    if (this.closed) return;
    this.flushTimer?.cancel();
    this.flushTimer = this.r.o.system.clock.setTimeout(() => { this.flushTimer = null; void this.flush(); }, ms);
  }

  private async flush(): Promise<void> {
    if (this.closed || this.flushing) return;
    this.flushing = true;
    try {
      if (!this.seeded) {
        const generation = this.seedGeneration;
        const seed = await this.sendSeed();
        if (seed === null) return;
        const reply = await this.ref.request<ReplicateReply & Record<string, unknown>>('seed', seed.last as unknown as Record<string, unknown>, { timeoutMs: Math.max(10_000, this.r.timeoutMs) });
        if (generation !== this.seedGeneration) {
          // A restore replaced the state while this seed was on its way: the replica holds the old one; seed it again.
          this.schedule(0);
          return;
        }
        this.seeded = true;
        this.unseedable = false;
        // Updates at or below the seed's position are in it.
        this.entries = this.entries.filter((e) => e.rseq > seed.last.base_rseq);
        this.ack(Math.max(reply.applied_to, seed.last.base_rseq));
        this.sentTo = this.ackedTo;
        // Nothing since the seed's position (an idle shard): caught up now, not at the next update.
        this.reportIfCaughtUp();
        this.r.o.log.info({ shard: this.r.o.shard, to: this.node, base_rseq: seed.last.base_rseq, segments: seed.segments, bytes: seed.bytes, log_chunks: seed.logChunks },
          `shard ${this.r.o.shard}: seeded its replica on ${this.node} (${seed.segments} segment(s), ${seed.bytes} bytes of state, its logs in ${seed.logChunks} message(s)); streaming the updates since`);
      }
      while (!this.closed) {
        const batch = this.nextBatch();
        if (batch.length === 0) break;
        this.sentTo = batch[batch.length - 1]!.rseq;
        const reply = await this.ref.request<ReplicateReply & Record<string, unknown>>('replicate', {
          epoch: this.r.epoch, primary: this.r.o.node, entries: batch,
        }, { timeoutMs: this.r.timeoutMs });
        if (this.cannotCatchUp(reply.applied_to)) {
          this.r.o.log.warn({ shard: this.r.o.shard, to: this.node, applied_to: reply.applied_to, rseq: this.r.streamPosition },
            `shard ${this.r.o.shard}: replica on ${this.node} is at update ${reply.applied_to}, which this stream cannot continue (primary at ${this.r.streamPosition}); seeding it`);
          this.reseed();
          return;
        }
        this.ack(reply.applied_to);
        // A gap (an earlier message lost): send again from what it has.
        if (reply.applied_to < this.sentTo) this.sentTo = reply.applied_to;
        this.attempt = 0;
      }
    } catch (e) {
      if (e instanceof FencedError) {
        this.r.fence(`replica ${this.node} follows a newer plan: ${e.message}`);
        return;
      }
      this.sentTo = this.ackedTo;
      this.attempt++;
      if (e instanceof PayloadTooLargeError) {
        // Re-sending cannot help until the limit is raised (a restart with the new config): say so, and try seldom.
        if (this.attempt === 1 || this.attempt % 10 === 0) {
          this.r.o.log.error({ shard: this.r.o.shard, to: this.node, err: e.message },
            `shard ${this.r.o.shard}: cannot ${this.seeded ? 'replicate' : 'seed its replica'} on ${this.node}: ${e.message}`);
        }
        if (!this.seeded) this.cannotSeed(e.message);
        this.schedule(TOO_LARGE_RETRY_MS);
        return;
      }
      if (this.attempt === 1 || this.attempt % 20 === 0) {
        this.r.o.log.warn({ shard: this.r.o.shard, to: this.node, err: (e as Error).message, retryable: isRetryable(e), lag: this.entries.length },
          `shard ${this.r.o.shard}: replica on ${this.node} does not confirm updates yet; re-sending (it is dropped from the plan if it is dead)`);
      }
      this.schedule(Math.min(500, 25 * 2 ** Math.min(this.attempt, 5)));
      return;
    } finally {
      this.flushing = false;
    }
    if (this.entries.some((e) => e.rseq > this.sentTo)) this.schedule(0);
  }

  /**
   * The unsent entries for one `replicate` message: at most
   * MAX_ENTRIES_PER_MESSAGE, and no more bytes than fit the message limit
   * (always one: a push fitted the limit when it arrived). Before, 64 pushes
   * near the limit went as one message over it, refused for good: the
   * replica stopped following.
   */
  private nextBatch(): ReplicationEntry[] {
    const budget = segmentBudget(this.r.o.system.transport.maxMessageBytes);
    const out: ReplicationEntry[] = [];
    let bytes = 0;
    for (const e of this.entries) {
      if (e.rseq <= this.sentTo) continue;
      const n = entryBytes(e);
      if (out.length > 0 && (out.length >= MAX_ENTRIES_PER_MESSAGE || bytes + n > budget)) break;
      out.push(e);
      bytes += n;
    }
    return out;
  }

  /**
   * Sends the primary's state to the replica in segments that each fit the
   * message limit (`seed_begin`, then `seed_part`s), and returns the seed's
   * last message (its position and logs), or null when the link closed
   * meanwhile. A segment not confirmed fails the whole seed: the next try
   * starts over from a fresh copy of the state.
   */
  private async sendSeed(): Promise<{ last: SeedMessage; segments: number; bytes: number; logChunks: number } | null> {
    const { state: snapshot, last: whole } = this.r.seedMessage(this.node);
    const budget = segmentBudget(this.r.o.system.transport.maxMessageBytes);
    const { head, segments } = splitSnapshot(snapshot, budget);
    const base = { epoch: whole.epoch, primary: whole.primary, transfer: whole.transfer };
    // The logs in chunks that each fit, too: all but the last as `seed_logs`, the last in the seed's last message.
    const logs = splitSeedLogs(whole, budget);
    const last: SeedMessage = { ...whole, ...logs[logs.length - 1]! };
    await this.ref.request('seed_begin', { ...base, head, segments: segments.length }, { timeoutMs: Math.max(10_000, this.r.timeoutMs) });
    let bytes = 0;
    for (let index = 0; index < segments.length; index++) {
      if (this.closed) return null;
      const segment = segments[index]!;
      const n = segmentBytes(segment);
      bytes += n;
      // A big segment over a slow link: at least 1 MB/s before it counts as lost.
      await this.ref.request('seed_part', { ...base, index, segment }, { timeoutMs: Math.max(10_000, this.r.timeoutMs, Math.ceil(n / 1_000)) });
    }
    for (let index = 0; index < logs.length - 1; index++) {
      if (this.closed) return null;
      await this.ref.request('seed_logs', { ...base, index, ...logs[index]! }, { timeoutMs: Math.max(10_000, this.r.timeoutMs, Math.ceil(budget / 1_000)) });
    }
    return this.closed ? null : { last, segments: segments.length, bytes, logChunks: logs.length };
  }

  /**
   * The seed was refused as too large: the replica holds no copy, so the
   * pushes waiting for it are answered and later ones do not wait (as for a
   * backup that left the plan), and the scheduler is told, once, so that it
   * stops counting the replica as a backup. The updates kept for it go: the
   * next seed holds them.
   */
  private cannotSeed(why: string): void {
    this.entries = [];
    this.closingInAt = null;
    if (this.unseedable) return;
    this.unseedable = true;
    this.releaseWaiters();
    this.r.unseedable(this.node, why);
  }

  /**
   * The replica applied updates this primary does not have (a backup ahead
   * of the one promoted), or lacks one the link no longer holds (a restarted
   * replica, a gap older than what a promoted backup retained).
   */
  private cannotCatchUp(appliedTo: number): boolean {
    if (appliedTo > this.r.streamPosition) return true;
    return appliedTo < this.r.streamPosition && appliedTo < this.sentTo && !this.entries.some((e) => e.rseq === appliedTo + 1);
  }

  private ack(to: number): void {
    if (to <= this.ackedTo) return;
    this.ackedTo = to;
    let k = 0;
    while (k < this.entries.length && this.entries[k]!.rseq <= to) k++;
    if (k) this.entries.splice(0, k);
    if (this.waiters.length) {
      const still: Waiter[] = [];
      for (const w of this.waiters) (w.rseq <= to ? w.resolve() : still.push(w));
      this.waiters = still;
    }
    this.reportIfCaughtUp();
  }

  /**
   * A seeded replica is reported once, to be made a backup, when it has
   * confirmed every update up to the position where pushes began to wait for
   * it (`closingInAt`: at most a message behind then; at once when nothing
   * was unconfirmed).
   */
  private reportIfCaughtUp(): void {
    if (this.gating || !this.seeded || this.reportedCaughtUp) return;
    if (this.closingInAt === null) {
      if (this.entries.length > MAX_ENTRIES_PER_MESSAGE) return;
      this.closingInAt = this.r.streamPosition;
    }
    if (this.ackedTo >= this.closingInAt) {
      this.reportedCaughtUp = true;
      this.r.caughtUp(this.node);
    }
  }
}

// ---------------------------------------------------------------- the replica

export class Replica {
  role: ReplicaRole;
  epoch: number;
  /** For a backup: the primary whose stream it applies. */
  primaryNode: string;
  /** A backup that has its state (from the job's start, or from a seed). */
  seeded: boolean;
  fenced = false;
  readonly timeoutMs: number;
  /** Primary: the last update numbered. Backup: the last update applied. */
  private rseq = 0;
  private readonly links = new Map<string, ReplicationLink>();
  private readonly dedup = new DedupTable();
  /** The dedup table and batch logs frozen with the state for a checkpoint (`freeze` … `takeFrozen`). */
  private frozenLogs: { token: string; dedup: DedupWindowWire[]; applied: [string, number][]; refused: string[] } | null = null;
  private readonly pending = new Map<string, DeferredReply[]>();
  private readonly applied = new Map<string, number>();
  private readonly refused = new Set<string>();
  /** Contributions to synchronous rounds not applied yet (a seed replays them). */
  private openRounds: ReplicationEntry[] = [];
  /**
   * Backup: the process (sender id) of `primaryNode` whose stream it applies.
   * A restarted primary process starts from a fresh state under the same
   * plan: its stream is refused (it is fenced) until a new plan says who
   * the primary is.
   */
  private primarySender: string | null = null;
  /** Backup: the last updates it applied, so that if it is promoted it can catch up the other backups without seeding them. */
  private recent: ReplicationEntry[] = [];
  /** A seed arriving in segments (`seed_begin` … `seed`). */
  private readonly incoming: IncomingSnapshot;
  /** The logs of the seed in progress that came ahead of its last message (`seed_logs`), in order. */
  private incomingLogs: { transfer: string; chunks: SeedLogs[] } | null = null;
  /** Numbers the seeds this primary sends (and the integrity logs it hands out in parts). */
  private nextTransfer = 0;
  /** The applied-batch log a paged integrity reply left out, in parts that each fit a message. */
  private integrityParts: { token: string; parts: [string, number][][] } | null = null;

  constructor(readonly o: ReplicaOptions, plan: ShardPlan, role: ReplicaRole) {
    this.role = role;
    this.epoch = plan.version;
    this.primaryNode = plan.placement.replicas[o.shard]!.primary;
    this.seeded = role !== 'seeding';
    this.timeoutMs = o.requestTimeoutMs ?? 1_000;
    this.incoming = new IncomingSnapshot(`shard ${o.shard}: the replica on ${o.node}: seed`);
    o.state.setEpoch(plan.version);
    if (role === 'primary') this.followLinks(plan, true);
  }

  get state(): ShardState { return this.o.state; }
  /** Primary: the last update numbered; backup: the last applied. */
  get streamPosition(): number { return this.rseq; }

  /** A newer plan: the replica's role, its primary, and (as primary) the streams to its backups follow it. */
  follow(plan: ShardPlan, role: ReplicaRole): void {
    if (plan.version <= this.epoch) return;
    const was = this.role;
    const primary = plan.placement.replicas[this.o.shard]!.primary;
    this.epoch = plan.version;
    this.o.state.setEpoch(plan.version);
    if (this.fenced) return;
    if (role === 'primary') {
      let retained: ReplicationEntry[] = [];
      if (was !== 'primary') {
        this.o.log.warn({ shard: this.o.shard, node: this.o.node, epoch: plan.version, rseq: this.rseq },
          `shard ${this.o.shard}: this replica on ${this.o.node} is the primary from plan v${plan.version} (was ${was})`);
        // A promoted backup numbers its own stream from where it applied; the backups kept get what they lack from its last updates.
        this.links.clear();
        retained = this.recent;
        this.recent = [];
      }
      this.role = 'primary';
      this.followLinks(plan, false, retained);
      return;
    }
    if (was === 'primary') {
      this.fence(`plan v${plan.version} makes ${primary} the primary`);
      return;
    }
    if (primary !== this.primaryNode) {
      this.primaryNode = primary;
      this.primarySender = null;
      // A caught-up backup kept by a failover follows the promoted one's stream, which goes on numbering
      // from where that one applied (it sends what this one lacks, or a seed); anything else waits for a seed.
      if (!(role === 'backup' && was === 'backup' && this.seeded)) {
        this.seeded = false;
        this.rseq = 0;
        this.recent = [];
      }
    }
    this.role = role;
  }

  /** Links to every other replica of the plan: backups are waited for, seeding ones are seeded first. */
  private followLinks(plan: ShardPlan, fromStart: boolean, retained: readonly ReplicationEntry[] = []): void {
    const r = plan.placement.replicas[this.o.shard]!;
    const wanted = new Set([...r.backups, ...r.seeding]);
    for (const [node, link] of this.links) if (!wanted.has(node)) { link.close(); this.links.delete(node); }
    for (const node of r.backups) {
      const link = this.links.get(node);
      if (link) link.gating = true;
      // At the job's start every replica begins from the same initial state: no seed needed. A backup kept
      // by a failover gets what it lacks from the promoted one's last updates (or a seed when that is not enough).
      else this.links.set(node, new ReplicationLink(this, node, true, this.rseq, !fromStart && retained.length === 0 && this.rseq > 0, retained));
    }
    for (const node of r.seeding) {
      const link = this.links.get(node);
      // A backup the plan made seeding again (one its primary could not seed) is no longer waited for.
      if (link) link.gating = false;
      else this.links.set(node, new ReplicationLink(this, node, false, this.rseq, true));
    }
  }

  /** Deposed: nothing more is applied or answered here. */
  fence(why: string): void {
    if (this.fenced) return;
    this.fenced = true;
    this.o.log.warn({ shard: this.o.shard, node: this.o.node, epoch: this.epoch }, `shard ${this.o.shard}: replica on ${this.o.node} fenced (${why}); it serves nothing until it is seeded again`);
    const err = this.notPrimary('push');
    for (const l of this.links.values()) l.fail(err);
    this.links.clear();
  }

  /**
   * The replica's actor stopped (its node leaves, or drops it): its streams
   * stop too, and the pushes still waiting for a backup fail with `why`
   * (not acknowledged: their clients re-read the plan and retry).
   */
  stop(why: Error): void {
    for (const l of this.links.values()) l.fail(why);
    this.links.clear();
  }

  /** A replica this primary cannot seed (see ReplicationLink.cannotSeed): said once, and reported to the scheduler until it hears. */
  unseedable(node: string, why: string): void {
    this.o.log.error({ shard: this.o.shard, to: node },
      `shard ${this.o.shard}: its replica on ${node} holds no copy and cannot be seeded; pushes no longer wait for it, and the failover is told (a backup becomes seeding again) `
      + `(the seed is tried again every ${TOO_LARGE_RETRY_MS / 1000} s: raise communication.max_message_bytes and restart the job to protect the shard again)`);
    this.tellFailover(node, 'that a replica cannot be seeded', () => this.o.onUnseedable(this.o.shard, node, this.epoch, why));
  }

  caughtUp(node: string): void {
    this.tellFailover(node, 'that a seeded replica caught up', () => this.o.onCaughtUp(this.o.shard, node, this.epoch), () => !this.links.get(node)!.gating);
  }

  /**
   * Sends a report about the replica on `node` to the scheduler's failover,
   * again with a growing pause until it is heard, while this replica is the
   * primary with a link to `node` (and `still()` holds).
   */
  private tellFailover(node: string, what: string, send: () => Promise<void>, still: () => boolean = () => true): void {
    const attempt = (n: number): void => {
      if (this.fenced || this.role !== 'primary' || !this.links.has(node) || !still()) return;
      send().catch((e: unknown) => {
        if (n === 0 || n % 20 === 0) this.o.log.warn({ shard: this.o.shard, node, err: (e as Error).message }, `could not tell the scheduler ${what}; retrying`);
        this.o.system.clock.setTimeout(() => attempt(n + 1), Math.min(2_000, 200 * (n + 1)));
      });
    };
    attempt(0);
  }

  // ---------------------------------------------------------------- serving (primary)

  notPrimary(op: string): StalePlanError {
    const why = this.fenced ? 'it was deposed (fenced)' : this.role === 'primary' ? 'it is not serving' : `it is a ${this.role} of plan v${this.epoch}, the primary is on ${this.primaryNode}`;
    return new StalePlanError(`shard ${this.o.shard}: the replica on ${this.o.node} does not serve ${op}: ${why}; re-read the plan`, {
      data: { shard: this.o.shard, shard_plan_version: this.epoch, request_plan_version: -1 },
    });
  }

  private requirePrimary(op: string): void {
    if (this.fenced || this.role !== 'primary') throw this.notPrimary(op);
  }

  pull(m: Parameters<ShardState['pull']>[0]): ReturnType<ShardState['pull']> {
    this.requirePrimary('pull');
    return this.o.state.pull(m);
  }

  push(from: string, seq: number, m: PushRequest): PushReply | DeferredReply {
    this.requirePrimary('push');
    const key = `${from}#${seq}`;
    const joined = this.pending.get(key);
    if (joined) {
      const d = new DeferredReply();
      joined.push(d);
      return d;
    }
    const cached = this.dedup.get(from, seq);
    if (cached === 'evicted') throw new HetpsError(`request ${from}#${seq} was already applied; its reply is no longer kept`);
    if (cached !== null) return cached;
    let push = m;
    if (m.batches.length > 0 && m.batches.every((b) => this.applied.has(b))) {
      // Trained again after its first worker died unacknowledged: applied here already.
      if (m.round === null) return { version: this.o.state.version, applied: false, staleness: 0, lr_scale: 0 };
      push = { ...m, dense: [], sparse: [], weight: 0, batches: [] };
    }
    let reply: PushReply;
    try {
      reply = this.o.state.push(push);
    } catch (e) {
      if (e instanceof StaleUpdateError) {
        for (const b of push.batches) this.refused.add(b);
        this.stream({ rseq: ++this.rseq, kind: 'refused', from, seq, push: emptied(push), lr_scale: 0, reply: null });
      }
      throw e;
    }
    this.dedup.record(from, seq, reply);
    this.noteApplied(push.batches);
    const entry: ReplicationEntry = reply.sparse_lr_scale === undefined
      ? { rseq: ++this.rseq, kind: 'push', from, seq, push, lr_scale: reply.lr_scale, reply }
      : { rseq: ++this.rseq, kind: 'push', from, seq, push, lr_scale: reply.lr_scale, sparse_lr_scale: reply.sparse_lr_scale, reply };
    if (push.round !== null) this.trackRound(entry);
    const waits = this.stream(entry);
    if (waits.length === 0) return reply;
    const d = new DeferredReply();
    const list = [d];
    this.pending.set(key, list);
    Promise.all(waits).then(
      () => { this.pending.delete(key); for (const x of list) x.resolve(reply); },
      (e: unknown) => { this.pending.delete(key); for (const x of list) x.reject(e); },
    );
    return d;
  }

  /** Lowers a synchronous round's expected count here and on every other replica. */
  roundExpected(m: { plan_version: number; round: number; expected: number }): { round: number; expected: number | null } {
    this.requirePrimary('round_expected');
    const out = this.o.state.lowerRoundExpected(m.plan_version, m.round, m.expected);
    const entry: ReplicationEntry = {
      rseq: ++this.rseq, kind: 'round_expected', from: this.o.node, seq: 0,
      push: { plan_version: m.plan_version, round: m.round, expected: m.expected, weight: 0, base_version: 0, dense: [], sparse: [], later_steps: [], lr_mult: 1, batches: [] },
      lr_scale: 0, reply: null,
    };
    this.stream(entry);
    return out;
  }

  /** Appends to every stream; returns what the reply must wait for. */
  private stream(entry: ReplicationEntry): Promise<void>[] {
    const waits: Promise<void>[] = [];
    for (const link of this.links.values()) {
      link.append(entry);
      if (!link.holdsPushes) continue;
      if (this.o.replication === 'sync') waits.push(link.waitFor(entry.rseq));
      else if (link.lag > this.o.lagLimit) waits.push(link.waitFor(entry.rseq - this.o.lagLimit));
    }
    return waits;
  }

  private trackRound(entry: ReplicationEntry): void {
    const round = this.o.state.round;
    this.openRounds = this.openRounds.filter((e) => (e.push.round ?? -1) >= round);
    if ((entry.push.round ?? -1) >= round) this.openRounds.push(entry);
  }

  private noteApplied(batches: readonly string[]): void {
    for (const b of batches) this.applied.set(b, (this.applied.get(b) ?? 0) + 1);
  }

  /**
   * Restore (checkpoint, API): the primary's state is replaced (a whole
   * snapshot, or one sent in segments: `restore_begin`, `restore_part`), and
   * every other replica is seeded again.
   */
  restore(m: RestoreRequest): ReturnType<ShardState['restore']> {
    this.requirePrimary('restore');
    return this.restoreState(this.o.state.restoreInput(m));
  }

  /**
   * A resume whose checkpoint this process reads itself (`restore_files`,
   * checkpoint.written_by: shards): this shard's files of the checkpoint at
   * `path` (its delta chain applied, each file checked), restored as
   * `restore` would. A state laid out for another plan is refused
   * (ValidationError) as `restore` refuses it; a checkpoint it cannot read,
   * with a CheckpointError naming the file.
   */
  async restoreFiles(path: string): Promise<ReturnType<ShardState['restore']>> {
    this.requirePrimary('restore_files');
    const state = await readShardFromCheckpoint(path, this.o.shard);
    // Still the primary once the files are read (a new plan may have come meanwhile).
    this.requirePrimary('restore_files');
    return this.restoreState(state);
  }

  private restoreState(state: Record<string, unknown> | ShardSnapshot): ReturnType<ShardState['restore']> {
    const out = this.o.state.restore(state);
    // The table and logs as of the snapshot's cut (none in an older checkpoint): pushes applied since are forgotten with their updates.
    const logs = state as { dedup?: DedupWindowWire[]; applied?: [string, number][]; refused?: string[] };
    this.dedup.import(logs.dedup ?? []);
    this.applied.clear();
    for (const [b, n] of logs.applied ?? []) this.applied.set(b, n);
    this.refused.clear();
    for (const b of logs.refused ?? []) this.refused.add(b);
    this.openRounds = [];
    for (const l of this.links.values()) l.reseed();
    return out;
  }

  snapshot(): ReturnType<ShardState['snapshot']> {
    this.requirePrimary('snapshot');
    return this.o.state.snapshot(false);
  }

  /** A checkpoint's cut: the state's copy, and the dedup table as of the same moment. */
  freeze(token: string): ReturnType<ShardState['freeze']> {
    this.requirePrimary('freeze');
    const out = this.o.state.freeze(token);
    this.frozenLogs = { token, dedup: this.dedup.export(), applied: [...this.applied], refused: [...this.refused] };
    return out;
  }

  /** `fn`'s answer when this replica is the primary (a StalePlanError otherwise, as for every client op). */
  primaryOnly<T>(op: string, fn: () => T): T {
    this.requirePrimary(op);
    return fn();
  }

  /** The copy of the cut `token` with the logs of the same moment: whole, or (`maxSegmentBytes`) its head, its segments to be taken with `take_frozen_part`. */
  takeFrozen(token: string, maxSegmentBytes?: number): Record<string, unknown> {
    this.requirePrimary('take_frozen');
    const state = maxSegmentBytes === undefined ? this.o.state.takeFrozen(token) : this.o.state.takeFrozenSegments(token, maxSegmentBytes);
    return { ...state, ...this.takeFrozenLogs(token) };
  }

  /** The logs `freeze(token)` kept with the copy, handed over once (none for another token). */
  private takeFrozenLogs(token: string): Required<Pick<ShardSnapshot, 'dedup' | 'applied' | 'refused'>> {
    const logs = this.frozenLogs?.token === token ? this.frozenLogs : { dedup: [], applied: [], refused: [] };
    this.frozenLogs = null;
    return { dedup: logs.dedup, applied: logs.applied, refused: logs.refused };
  }

  /** `take_frozen`, written by this process into `dir` as the shard's checkpoint files (`checkpoint.written_by: shards`), a delta on `chain.base` where it wrote that one. */
  writeFrozen(token: string, dir: string, partBytes?: number, chain: { name?: string; base?: string | null } = {}): Promise<WrittenShard> {
    this.requirePrimary('write_frozen');
    return this.o.state.writeFrozen(token, dir, partBytes, this.takeFrozenLogs(token), chain);
  }

  /**
   * What a new replica on `to` starts from: a copy of the state as of update
   * `rseq` (sent in segments) and the seed's last message (see `seed`).
   */
  seedMessage(to: string): { state: ShardSnapshot; last: SeedMessage } {
    const round = this.o.state.round;
    return {
      state: this.o.state.snapshot(true),
      last: {
        epoch: this.epoch, primary: this.o.node, base_rseq: this.rseq, transfer: `${this.o.node}>${to}:${this.epoch}:${(this.nextTransfer++).toString(36)}`,
        dedup: this.dedup.export(),
        applied: [...this.applied],
        refused: [...this.refused],
        open_rounds: this.openRounds.filter((e) => (e.push.round ?? -1) >= round),
      },
    };
  }

  // ---------------------------------------------------------------- following (backup)

  /** Refuses a primary that is not the primary of this replica's plan; asks a newer one to retry. */
  private checkSender(epoch: number, primary: string, op: string): void {
    const data = { shard: this.o.shard, epoch, replica_epoch: this.epoch };
    if (this.role === 'primary' || this.fenced || primary !== this.primaryNode) {
      if (epoch > this.epoch) throw new StalePlanError(`shard ${this.o.shard}: ${op} from ${primary} under plan v${epoch}; the replica on ${this.o.node} has not seen it yet`, { data });
      throw new FencedError(`shard ${this.o.shard}: ${op} from ${primary} refused: under plan v${this.epoch} the primary is ${this.role === 'primary' ? this.o.node : this.primaryNode}`, { data });
    }
  }

  /** Refuses a stream from another process of the primary than the one this backup follows (a restarted primary, see `primarySender`). */
  private checkIncarnation(from: string | undefined, primary: string, op: string): void {
    if (from === undefined) return;
    if (this.primarySender === null) { this.primarySender = from; return; }
    if (from === this.primarySender) return;
    throw new FencedError(`shard ${this.o.shard}: ${op} from a new process of ${primary} refused: it restarted under plan v${this.epoch} and holds a fresh state, `
      + `where the replica on ${this.o.node} has the updates of the one before; a new plan will say who the primary is`, { data: { shard: this.o.shard, epoch: this.epoch } });
  }

  replicate(m: { epoch: number; primary: string; entries: ReplicationEntry[]; from?: string }): ReplicateReply {
    this.checkSender(m.epoch, m.primary, 'replicate');
    this.checkIncarnation(m.from, m.primary, 'replicate');
    if (!this.seeded) return { applied_to: this.rseq };
    for (const e of m.entries) {
      if (e.rseq <= this.rseq) continue;
      if (e.rseq !== this.rseq + 1) break;
      this.applyEntry(e);
      this.rseq = e.rseq;
      this.recent.push(e);
    }
    if (this.recent.length > RETAINED_ENTRIES) this.recent.splice(0, this.recent.length - RETAINED_ENTRIES);
    return { applied_to: this.rseq };
  }

  /** One update of the primary's stream, at the primary's rates and with the part it left out (its reply's `dropped`). */
  private applyUpdate(e: ReplicationEntry): void {
    this.o.state.applyReplicated(e.push, e.lr_scale, e.sparse_lr_scale ?? e.lr_scale, e.reply?.dropped ?? null);
  }

  private applyEntry(e: ReplicationEntry): void {
    if (e.kind === 'round_expected') {
      this.o.state.lowerRoundExpected(this.o.state.planVersion, e.push.round!, e.push.expected!);
      return;
    }
    if (e.kind === 'refused') {
      this.o.state.noteRefused(e.push);
      for (const b of e.push.batches) this.refused.add(b);
      return;
    }
    this.applyUpdate(e);
    if (e.reply !== null) this.dedup.record(e.from, e.seq, e.reply);
    this.noteApplied(e.push.batches);
    if (e.push.round !== null) this.trackRound(e);
  }

  /** A seed begins (see `seed`): the state's layout, its arrays to follow in `segments` parts. */
  seedBegin(m: { epoch: number; primary: string; transfer: string; head: SnapshotHead; segments: number }): Record<string, never> {
    this.checkSender(m.epoch, m.primary, 'seed_begin');
    this.incoming.begin(m.transfer, m.head, m.segments, this.o.shard, m.primary);
    this.incomingLogs = { transfer: m.transfer, chunks: [] };
    return {};
  }

  /** Chunk `index` (0, 1, … in order) of the logs of the seed `transfer`, ahead of its last message. */
  seedLogs(m: SeedLogs & { epoch: number; primary: string; transfer: string; index: number }): { received: number } {
    this.checkSender(m.epoch, m.primary, 'seed_logs');
    const into = this.incomingLogs;
    if (into === null || into.transfer !== m.transfer) {
      throw new ValidationError(`shard ${this.o.shard}: the replica on ${this.o.node}: seed_logs of transfer ${m.transfer}, but ${into === null ? 'no seed is in progress' : `the seed in progress is ${into.transfer}`}; start the seed again (seed_begin)`);
    }
    if (m.index !== into.chunks.length) {
      throw new ValidationError(`shard ${this.o.shard}: the replica on ${this.o.node}: seed_logs ${m.index} of transfer ${m.transfer} out of order (expected ${into.chunks.length}); start the seed again (seed_begin)`);
    }
    into.chunks.push({ dedup: m.dedup, applied: m.applied, refused: m.refused, open_rounds: m.open_rounds });
    return { received: into.chunks.length };
  }

  seedPart(m: { epoch: number; primary: string; transfer: string; index: number; segment: SnapshotSegment }): { received: number } {
    this.checkSender(m.epoch, m.primary, 'seed_part');
    return { received: this.incoming.part(m.transfer, m.index, m.segment) };
  }

  seed(m: SeedMessage & { from?: string }): ReplicateReply {
    this.checkSender(m.epoch, m.primary, 'seed');
    const snapshot = this.incoming.finish(m.transfer);
    const ahead = this.incomingLogs?.transfer === m.transfer ? this.incomingLogs.chunks : [];
    this.incomingLogs = null;
    const logs = ahead.length === 0 ? m : mergeSeedLogs([...ahead, m]);
    // A seed replaces the whole state: whichever process of the primary sends it is the one followed from now on.
    this.o.state.restore(snapshot);
    this.primarySender = m.from ?? null;
    this.dedup.import(logs.dedup);
    this.applied.clear();
    for (const [b, n] of logs.applied) this.applied.set(b, n);
    this.refused.clear();
    for (const b of logs.refused) this.refused.add(b);
    this.openRounds = [];
    for (const e of logs.open_rounds) {
      this.applyUpdate(e);
      this.trackRound(e);
    }
    this.rseq = m.base_rseq;
    this.recent = [];
    this.seeded = true;
    this.o.log.info({ shard: this.o.shard, node: this.o.node, primary: m.primary, base_rseq: m.base_rseq, version: this.o.state.version },
      `shard ${this.o.shard}: replica on ${this.o.node} seeded from ${m.primary} (update ${m.base_rseq}, version ${this.o.state.version})`);
    return { applied_to: this.rseq };
  }

  /**
   * The end-of-run check's figures. `paged`: an applied-batch log that does
   * not fit one message (with the rest of the reply) is cut into parts that
   * each fit, held under a token for `integrityPart` (one copy at a time: a
   * later paged request replaces it), and left out of the reply.
   */
  integrity(m: { paged?: boolean } = {}): IntegrityReply {
    let unreplicated = 0;
    for (const l of this.links.values()) if (l.gating) unreplicated = Math.max(unreplicated, l.lag);
    const head = {
      shard: this.o.shard, node: this.o.node, role: this.fenced ? 'fenced' : this.role, epoch: this.epoch, version: this.o.state.version,
      hash: this.o.state.stateHash(), refused: [...this.refused], unreplicated,
    };
    if (m.paged === true) {
      const budget = segmentBudget(this.o.system.transport.maxMessageBytes);
      // The log's parts as a seed's logs are cut, each leaving room for the refused batches beside it.
      const refusedBytes = head.refused.reduce((n, b) => n + 8 + utf8Bytes(b), 0);
      const parts = splitSeedLogs({ dedup: [], applied: [...this.applied], refused: [], open_rounds: [] }, Math.max(1, budget - refusedBytes)).map((c) => c.applied);
      if (parts.length > 1) {
        const token = `${this.o.node}:${(this.nextTransfer++).toString(36)}`;
        this.integrityParts = { token, parts };
        return { ...head, applied: {}, applied_token: token, applied_parts: parts.length };
      }
    }
    return { ...head, applied: Object.fromEntries(this.applied) };
  }

  /** Part `index` of the applied-batch log a paged `integrity` left out; the copy is dropped after the last part. */
  integrityPart(token: string, index: number): { applied: [string, number][] } {
    const held = this.integrityParts;
    if (held === null || held.token !== token) {
      throw new ValidationError(`shard ${this.o.shard}: the replica on ${this.o.node} holds no integrity log under ${token}${held === null ? '' : ` (it holds ${held.token})`}; ask for the integrity check again`);
    }
    const part = held.parts[index];
    if (part === undefined) throw new ValidationError(`shard ${this.o.shard}: integrity log ${token} has ${held.parts.length} parts, not part ${index}`);
    if (index === held.parts.length - 1) this.integrityParts = null;
    return { applied: part };
  }

  /** Replicas this one streams to, and how far behind each is. */
  linkLags(): Record<string, number> {
    return Object.fromEntries([...this.links].map(([n, l]) => [n, l.lag]));
  }
}

/** Bytes an entry takes in a `replicate` message, about: its tensors, batch ids and fields. */
function entryBytes(e: ReplicationEntry): number {
  let n = 256 + wireTensorBytes(e.push);
  for (const l of e.push.later_steps) n += 16 + wireTensorBytes(l);
  for (const b of e.push.batches) n += 8 + b.length;
  return n;
}

function emptied(m: PushRequest): PushRequest {
  return { ...m, dense: [], sparse: [], later_steps: [] };
}

export type ReplicaActorDefinition = ActorDefinition<ReplicaMessages> & { readonly replica: Replica };

/** The replica as an actor (kind `shard`, id `<shard>@<node>`). */
export function createReplicaActor(replica: Replica): ReplicaActorDefinition {
  const { state } = replica;
  return {
    kind: 'shard',
    id: replicaId(replica.o.shard, replica.o.node),
    messages: replicaMessages,
    replica,
    handlers: {
      pull: (m) => replica.pull(m),
      push: (m) => replica.push(m.from, m.seq, m),
      snapshot: () => replica.snapshot(),
      freeze: (m) => replica.freeze(m.token),
      take_frozen: (m) => replica.takeFrozen(m.token, m.segment_bytes),
      write_frozen: (m) => replica.writeFrozen(m.token, m.dir, m.part_bytes, { ...(m.name === undefined ? {} : { name: m.name }), ...(m.base === undefined ? {} : { base: m.base }) }),
      take_frozen_part: (m) => replica.primaryOnly('take_frozen_part', () => state.takeFrozenPart(m.token, m.index)),
      restore_begin: (m) => replica.primaryOnly('restore_begin', () => state.restoreBegin(m.transfer, m.head, m.segments)),
      restore_part: (m) => replica.primaryOnly('restore_part', () => state.restorePart(m.transfer, m.index, m.segment)),
      restore: (m) => replica.restore(m),
      restore_files: (m) => replica.restoreFiles(m.path),
      stats: (_m, ctx) => ({
        ...state.stats(ctx.stats.duplicates), node: replica.o.node, role: replica.fenced ? 'fenced' : replica.role, epoch: replica.epoch,
        // A replica without its state (restarted, waiting for its seed) has applied nothing a failover could promote.
        applied_rseq: replica.seeded ? replica.streamPosition : null,
        replica_lag: replica.linkLags(),
        // The whole server process's, the same in each of its replicas' stats (load balancing's measured capacity).
        loop_busy_ms: Math.round((replica.o.busyMs ?? loopBusyMs)()),
      }),
      replicate: (m) => replica.replicate(m),
      seed_begin: (m) => replica.seedBegin(m),
      seed_part: (m) => replica.seedPart(m),
      seed_logs: (m) => replica.seedLogs(m),
      seed: (m) => replica.seed(m),
      integrity: (m) => replica.integrity(m),
      integrity_part: (m) => replica.integrityPart(m.token, m.index),
      round_expected: (m) => replica.roundExpected(m),
    },
    onStop: () => {
      const why = replica.fenced ? replica.notPrimary('pull') : new StalePlanError(`shard ${replica.o.shard}: the replica on ${replica.o.node} stopped; re-read the plan`);
      state.rejectWaitingPulls(why);
      replica.stop(why);
    },
  };
}

/** Every node holding a replica of each shard, for callers that need them all (integrity, stats). */
export function allReplicas(plan: ShardPlan): { shard: string; node: string }[] {
  return plan.shards.flatMap((shard) => replicaNodes(plan.placement.replicas[shard]!).map((node) => ({ shard, node })));
}
