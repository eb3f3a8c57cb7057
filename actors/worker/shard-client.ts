/**
 * Requests from a worker (or the driver, or the API) to the shards, with the
 * retry rules of the parameter server:
 * - every request goes to the shard's primary under the newest plan the
 *   client has seen, and names that plan's version;
 * - a push keeps one seq for all its attempts, so a push retried after a
 *   lost reply, or at a promoted backup after a failover, is applied once
 *   (every replica holds the (from, seq) dedup table);
 * - a StalePlanError, no responder, or no answer within an attempt's time
 *   re-reads the plan and sends again (to the new primary, if it moved);
 *   each attempt that goes unanswered doubles the next one's time (up to
 *   a minute), so a request slower than an attempt on a slow link is
 *   answered in the end instead of re-sent for ever;
 * - a pull waiting for a synchronous round is re-sent until the round is
 *   there, logging what it waits for instead of hanging silently.
 */
import {
  HetpsError, TimeoutError, ValidationError, attemptTimeoutMs, isRetryable, type ActorRef, type ActorSystem, type Logger,
} from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import { pullReplyWire, pullReplyWireBytes, type PullReply, type PullReplyWire, type PullRequest, type PushReply, type PushRequest, type PushWire, type RestoreReply, type ShardSnapshot, type ShardStats, type DedupWindowWire } from '../shard/shard.messages.ts';
import { primaryReplicaId } from '../shard/replica.ts';
import { parseShardSnapshot, type WrittenShard } from '../shard/shard.actor.ts';
import { SnapshotAssembler, segmentBudget, segmentBytes, splitSnapshot, type SnapshotHead, type SnapshotSegment } from '../shard/snapshot-segments.ts';
import { PlanView } from '../store/plan-view.ts';

/** Thrown out of a wait when the worker was told to stop. */
export class StopRequestedError extends HetpsError {}

export interface ShardClientOptions {
  /** Per request, for reads that may take long (stats, snapshots). */
  requestTimeoutMs: number;
  /** Per attempt of a pull or push before the plan is re-read and the request sent again; default 2000 ms. */
  attemptTimeoutMs?: number;
  log: Logger;
  /** Polled while waiting; true ends the wait with StopRequestedError. */
  shouldStop: () => boolean;
  /** The plan the client routes by (followed as failovers write new versions). */
  plans: PlanView | ShardPlan;
}

function isStalePlan(e: unknown): boolean {
  return e instanceof Error && e.name === 'StalePlanError';
}

/** An attempt given up because a newer plan names another primary for its shard (sent again there, same seq). */
class PrimaryMovedError extends HetpsError {}

const worthAnotherTry = (e: unknown) => e instanceof PrimaryMovedError || isStalePlan(e) || isRetryable(e);

export class ShardClient {
  private refs = new Map<string, ActorRef>();
  readonly plans: PlanView;
  /** Requests sent again after a failover or a stale plan (for tests and the summary). */
  rerouted = 0;
  /** Numbers this client's restores in segments. */
  private nextTransfer = 0;

  constructor(readonly system: ActorSystem, private readonly opts: ShardClientOptions) {
    this.plans = opts.plans instanceof PlanView ? opts.plans : PlanView.fixed(opts.plans);
  }

  private get attemptMs(): number { return Math.min(this.opts.attemptTimeoutMs ?? 2_000, this.opts.requestTimeoutMs); }

  /** The shard's primary under the current plan. */
  ref(shard: string): ActorRef {
    const id = primaryReplicaId(this.plans.current, shard);
    let r = this.refs.get(id);
    if (!r) { r = this.system.ref('shard', id); this.refs.set(id, r); }
    return r;
  }

  /**
   * One attempt of a request to `shard`'s primary, given up at once when the
   * plan the client follows names another primary for it (a failover): the
   * caller sends it again there instead of waiting out the attempt.
   */
  private async attempt<T>(shard: string, send: () => Promise<T>): Promise<T> {
    const before = primaryReplicaId(this.plans.current, shard);
    let off: (() => void) | null = null;
    const moved = new Promise<never>((_, reject) => {
      off = this.plans.onChange((p) => {
        const now = p.placement.replicas[shard] === undefined ? before : primaryReplicaId(p, shard);
        if (now !== before) reject(new PrimaryMovedError(`${shard}: plan v${p.version} moved its primary from ${before} to ${now}`));
      });
    });
    moved.catch(() => undefined);
    const request = send();
    request.catch(() => undefined); // answered after the move: nobody waits for it
    try {
      return await Promise.race([request, moved]);
    } finally {
      (off as (() => void) | null)?.();
    }
  }

  /** After a refusal or silence: re-read the plan; true when the shard's primary moved. */
  private async reroute(shard: string): Promise<boolean> {
    const before = primaryReplicaId(this.plans.current, shard);
    await this.plans.refresh();
    this.rerouted++;
    return primaryReplicaId(this.plans.current, shard) !== before;
  }

  async pull(shard: string, req: PullRequest, expected: number | null = null): Promise<PullReply> {
    const started = this.system.clock.monotonic();
    let lastNote = started;
    let timeouts = 0;
    for (let attempt = 0; ; attempt++) {
      if (this.opts.shouldStop()) throw new StopRequestedError(`stopped while pulling from ${shard}`);
      req.plan_version = this.plans.current.version;
      try {
        const reply = await this.attempt(shard, () => this.ref(shard).request<PullReply & Record<string, unknown>>('pull', req as unknown as Record<string, unknown>, {
          timeoutMs: attemptTimeoutMs(this.attemptMs, timeouts),
        }));
        // A request built without the field (a caller's own, not pullRequest's) asked for float32, as the shard reads it.
        return req.compression === 'fp16' ? decodeCompressedPull(shard, reply) : reply;
      } catch (e) {
        if (!worthAnotherTry(e)) throw e;
        if (e instanceof TimeoutError) timeouts++;
        const moved = await this.reroute(shard);
        const now = this.system.clock.monotonic();
        const waited = Math.round((now - started) / 1000);
        if (req.min_round !== null && e instanceof TimeoutError && !moved) {
          if (now - lastNote < 10_000) continue;
          lastNote = now;
          const s = await this.stats(shard, 2_000).catch(() => null);
          this.opts.log.warn({ shard, round: req.min_round, waited_s: waited, shard_round: s?.round ?? null, contributions: s?.pending_contributions ?? null, expected },
            `bsp round ${req.min_round}: still waiting for ${shard} to apply round ${req.min_round - 1}`
            + (s ? ` (it has applied ${s.round} rounds and holds ${s.pending_contributions} of ${expected ?? '?'} contributions)` : ' (its stats do not answer either)')
            + ` after ${waited} s`);
        } else if (!moved) {
          if (attempt > 0 && attempt % 10 === 0) this.opts.log.warn({ shard, err: (e as Error).message, attempt, waited_s: waited }, `pull from ${shard} failed; retrying`);
          await this.system.clock.sleep(Math.min(500, 25 * 2 ** Math.min(attempt, 5)));
        }
      }
    }
  }

  /** One logical push: every attempt carries the same seq. */
  async push(shard: string, req: PushWire): Promise<PushReply> {
    const seq = this.system.nextSeq();
    const started = this.system.clock.monotonic();
    let timeouts = 0;
    for (let attempt = 0; ; attempt++) {
      req.plan_version = this.plans.current.version;
      try {
        return await this.attempt(shard, () => this.ref(shard).request<PushReply & Record<string, unknown>>('push', req as unknown as Record<string, unknown>, {
          timeoutMs: attemptTimeoutMs(this.attemptMs, timeouts), seq,
        }));
      } catch (e) {
        if (!worthAnotherTry(e)) throw e;
        if (e instanceof TimeoutError) timeouts++;
        if (this.opts.shouldStop()) throw new StopRequestedError(`stopped while pushing to ${shard}`, { cause: e });
        const moved = await this.reroute(shard);
        if (moved) continue;
        const waited = Math.round((this.system.clock.monotonic() - started) / 1000);
        if (attempt > 0 && attempt % 5 === 0) {
          this.opts.log.warn({ shard, err: (e as Error).message, waited_s: waited }, `push to ${shard} not answered yet; re-sending it (same seq, applied once)`);
        }
        await this.system.clock.sleep(Math.min(500, 25 * 2 ** Math.min(attempt, 5)));
      }
    }
  }

  /** bsp: round `round` of `shard` waits for `expected` contributions from now on (a worker was declared dead). */
  async lowerRound(shard: string, round: number, expected: number): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        await this.ref(shard).request('round_expected', { plan_version: this.plans.current.version, round, expected }, { timeoutMs: this.attemptMs });
        return;
      } catch (e) {
        if (!isStalePlan(e) && !isRetryable(e)) throw e;
        await this.reroute(shard);
      }
    }
  }

  stats(shard: string, timeoutMs = this.opts.requestTimeoutMs): Promise<ShardStats> {
    return this.ref(shard).request<ShardStats & Record<string, unknown>>('stats', {}, { timeoutMs });
  }

  snapshot(shard: string, timeoutMs = 60_000): Promise<ShardSnapshot> {
    return this.ref(shard).request<ShardSnapshot & Record<string, unknown>>('snapshot', {}, { timeoutMs, retries: 2 });
  }

  /** A checkpoint's cut: the shard copies its state in memory under `token` (see `takeFrozen`). */
  freeze(shard: string, token: string, timeoutMs = 60_000): Promise<{ version: number; round: number }> {
    return this.ref(shard).request<{ version: number; round: number }>('freeze', { token }, { timeoutMs, retries: 2 });
  }

  /**
   * The copy `freeze` made under `token`, in segments that each fit the
   * message limit (take_frozen, take_frozen_part), rebuilt here; handed over
   * once, so not retried (a lost reply fails this checkpoint, not the next).
   * `timeoutMs` per message, and at least 1 s per MB of a segment.
   */
  async takeFrozen(shard: string, token: string, timeoutMs = 60_000): Promise<ShardSnapshot> {
    const ref = this.ref(shard);
    const budget = segmentBudget(this.system.transport.maxMessageBytes);
    const first = await ref.request<{ head: SnapshotHead; segments: number; dedup?: DedupWindowWire[]; applied?: [string, number][]; refused?: string[] } & Record<string, unknown>>(
      'take_frozen', { token, segment_bytes: budget }, { timeoutMs, retries: 0 });
    const asm = new SnapshotAssembler(first.head, `shard ${shard}: the checkpoint copy ${token}`);
    for (let index = 0; index < first.segments; index++) {
      const { segment } = await ref.request<{ segment: SnapshotSegment }>('take_frozen_part', { token, index }, { timeoutMs: Math.max(timeoutMs, Math.ceil(budget / 1_000)), retries: 0 });
      asm.add(segment);
    }
    return { ...asm.finish(), ...(first.dedup ? { dedup: first.dedup, applied: first.applied ?? [], refused: first.refused ?? [] } : {}) };
  }

  /** A resume read by the shard itself: its files of the checkpoint at `path` (checkpoint.written_by: shards). */
  restoreFiles(shard: string, path: string, timeoutMs = 30 * 60_000): Promise<RestoreReply> {
    return this.ref(shard).request<RestoreReply & Record<string, unknown>>('restore_files', { path }, { timeoutMs, retries: 0 });
  }

  /**
   * The cut `token` written by the shard itself into `dir` as its checkpoint
   * files (checkpoint.written_by: shards); arrays past `partBytes` (default
   * 256 MiB) in part files, as the driver would write them.
   */
  writeFrozen(shard: string, token: string, dir: string, o: { partBytes?: number; timeoutMs?: number; name?: string; base?: string | null } = {}): Promise<WrittenShard> {
    return this.ref(shard).request<WrittenShard & Record<string, unknown>>('write_frozen', {
      token, dir, ...(o.partBytes === undefined ? {} : { part_bytes: o.partBytes }), ...(o.name === undefined ? {} : { name: o.name }), ...(o.base === undefined ? {} : { base: o.base }),
    }, { timeoutMs: o.timeoutMs ?? 30 * 60_000, retries: 0 });
  }

  /**
   * Replaces the shard's state (its primary's; the backups are seeded again
   * from it), sent in segments that each fit the message limit
   * (restore_begin, restore_part, restore: the shard restores it all at
   * once). A message lost on the way (a timeout, a primary moving) starts
   * the transfer over, twice at most; a state the shard refuses fails at once.
   */
  async restore(shard: string, state: unknown, timeoutMs = 60_000): Promise<RestoreReply> {
    const snap = parseShardSnapshot(state, `restore of shard ${shard}`) as ShardSnapshot;
    const budget = segmentBudget(this.system.transport.maxMessageBytes);
    const { head, segments } = splitSnapshot(snap, budget);
    const logs = { dedup: snap.dedup ?? [], applied: snap.applied ?? [], refused: snap.refused ?? [] };
    for (let attempt = 0; ; attempt++) {
      const transfer = `${this.system.senderId}:${shard}:${this.nextTransfer++}`;
      try {
        const ref = this.ref(shard);
        await ref.request('restore_begin', { transfer, head, segments: segments.length }, { timeoutMs, retries: 0 });
        for (let index = 0; index < segments.length; index++) {
          await ref.request('restore_part', { transfer, index, segment: segments[index]! }, { timeoutMs: Math.max(timeoutMs, Math.ceil(segmentBytes(segments[index]!) / 1_000)), retries: 0 });
        }
        return await ref.request<RestoreReply & Record<string, unknown>>('restore', { transfer, ...logs }, { timeoutMs, retries: 0 });
      } catch (e) {
        if (attempt >= 2 || !worthAnotherTry(e)) throw e;
        this.opts.log.warn({ shard, attempt, err: (e as Error).message }, `restore of shard ${shard}: ${(e as Error).message}; sending it again`);
      }
    }
  }
}

/**
 * Asks every shard for its stats until all answer. The error after
 * `timeoutMs` names the shards still missing.
 */
export async function waitForShards(system: ActorSystem, plan: ShardPlan, opts: { timeoutMs: number; log: Logger | null }): Promise<void> {
  const shards = plan.shards;
  const missing = new Set(shards);
  const clock = system.clock;
  const start = clock.monotonic();
  let lastNote = start;
  while (missing.size) {
    await Promise.all([...missing].map(async (s) => {
      try {
        const st = await system.ref('shard', primaryReplicaId(plan, s)).request<{ plan_version: number } & Record<string, unknown>>('stats', {}, { timeoutMs: 1_000 });
        // A replica still on an older plan (a node that started under an earlier run's plan and is switching) is not there yet.
        if (st.plan_version >= plan.version) missing.delete(s);
      } catch { /* not up yet */ }
    }));
    if (!missing.size) return;
    const now = clock.monotonic();
    if (now - start >= opts.timeoutMs) {
      throw new TimeoutError(`shard(s) still missing after ${Math.round(opts.timeoutMs / 1000)} s: ${[...missing].join(', ')} — start them with \`hetps launch --role server --server-id NAME\` (or check their logs)`, {
        data: { missing: [...missing] },
      });
    }
    if (now - lastNote >= 5_000) {
      lastNote = now;
      opts.log?.info({ missing: [...missing] }, `waiting for shard(s) ${[...missing].join(', ')}`);
    }
    await clock.sleep(250);
  }
}

/** Every shard's staleness histogram merged (same bucket bounds), plus the policy's counters: for the run's summary. */
export interface StalenessSummary {
  /** Bucket upper bounds; `counts[i]` counts pushes with staleness ≤ `le[i]` (and above the previous bound); the last count is above the last bound. */
  le: number[];
  counts: number[];
  /** Pushes measured, their mean and largest staleness. */
  count: number;
  mean: number;
  max: number;
  /** hps: pushes refused as staler than max_staleness, and applied at a reduced rate. */
  refused: number;
  scaled: number;
  /** Admitted pushes whose dense part, or rows, were dropped as beyond that kind's bound (training.max_staleness { dense, sparse }). */
  dense_dropped: number;
  sparse_dropped: number;
  /** The bound the shards enforce (the dense blocks' where each kind has its own); null: measured only (asp, bsp). */
  max_staleness: number | null;
  /** The embedding rows' bound (the same as max_staleness unless each kind has its own). */
  sparse_max_staleness: number | null;
  per_shard: Record<string, { count: number; mean: number; max: number; refused: number; scaled: number; dense_dropped: number; sparse_dropped: number }>;
}

/**
 * Asks every shard for its stats and merges their staleness histograms. A
 * shard that does not answer is left out (and named in the log), so a
 * summary never fails on it.
 */
export async function shardStalenessSummary(client: ShardClient, shards: readonly string[], log: Logger | null = null): Promise<StalenessSummary> {
  const stats = await Promise.all(shards.map((s) => client.stats(s).catch((e: unknown) => {
    log?.warn({ shard: s, err: (e as Error).message }, 'shard stats not available for the staleness summary');
    return null;
  })));
  const out: StalenessSummary = {
    le: [], counts: [], count: 0, mean: 0, max: 0, refused: 0, scaled: 0, dense_dropped: 0, sparse_dropped: 0, max_staleness: null, sparse_max_staleness: null, per_shard: {},
  };
  let sum = 0;
  stats.forEach((st, i) => {
    if (st === null) return;
    const h = st.staleness;
    if (out.le.length === 0) { out.le = [...h.le]; out.counts = h.counts.map(() => 0); }
    h.counts.forEach((c, k) => { out.counts[k] = (out.counts[k] ?? 0) + c; });
    out.count += h.count;
    sum += h.sum;
    out.max = Math.max(out.max, h.max);
    out.refused += st.stale_refused;
    out.scaled += st.stale_scaled;
    out.dense_dropped += st.stale_dense_dropped;
    out.sparse_dropped += st.stale_sparse_dropped;
    out.max_staleness = st.max_staleness;
    out.sparse_max_staleness = st.sparse_max_staleness;
    out.per_shard[shards[i]!] = {
      count: h.count, mean: h.count ? h.sum / h.count : 0, max: h.max, refused: st.stale_refused, scaled: st.stale_scaled,
      dense_dropped: st.stale_dense_dropped, sparse_dropped: st.stale_sparse_dropped,
    };
  });
  out.mean = out.count ? sum / out.count : 0;
  return out;
}

/** A reply to a pull that asked for `compression`: float32 again, with its tensor bytes as sent (`wireBytes`). */
function decodeCompressedPull(shard: string, raw: unknown): PullReply {
  const parsed = pullReplyWire.safeParse(raw);
  if (!parsed.success) {
    throw new ValidationError(`shard ${shard}: malformed compressed pull reply: ${parsed.error.issues.map((i) => `${i.path.join('.') || '(reply)'}: ${i.message}`).join('; ')}`);
  }
  return { ...parsed.data, wireBytes: pullReplyWireBytes(raw as PullReplyWire) };
}
