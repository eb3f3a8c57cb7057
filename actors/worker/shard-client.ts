/**
 * Requests from a worker (or the driver, or the API) to the shards, with the
 * retry rules of the parameter server:
 * - a push keeps one seq for all its attempts, so a push retried after a
 *   lost reply is applied once (the shard deduplicates by (from, seq));
 * - a pull waiting for a synchronous round is re-sent until the round is
 *   there, logging what it waits for instead of hanging silently;
 * - a stale plan is not retried (the plan does not change during a run yet).
 */
import {
  HetpsError, TimeoutError, isRetryable, type ActorRef, type ActorSystem, type Logger,
} from '../../runtime/mod.ts';
import type { PullReply, PullRequest, PushReply, PushRequest, ShardSnapshot, ShardStats } from '../shard/shard.messages.ts';

/** Thrown out of a wait when the worker was told to stop. */
export class StopRequestedError extends HetpsError {}

export interface ShardClientOptions {
  /** Per attempt. */
  requestTimeoutMs: number;
  log: Logger;
  /** Polled while waiting; true ends the wait with StopRequestedError. */
  shouldStop: () => boolean;
}

function isStalePlan(e: unknown): boolean {
  return e instanceof Error && e.name === 'StalePlanError';
}

export class ShardClient {
  private refs = new Map<string, ActorRef>();
  constructor(readonly system: ActorSystem, private readonly opts: ShardClientOptions) {}

  ref(shard: string): ActorRef {
    let r = this.refs.get(shard);
    if (!r) { r = this.system.ref('shard', shard); this.refs.set(shard, r); }
    return r;
  }

  async pull(shard: string, req: PullRequest, expected: number | null = null): Promise<PullReply> {
    const started = this.system.clock.monotonic();
    for (let attempt = 0; ; attempt++) {
      if (this.opts.shouldStop()) throw new StopRequestedError(`stopped while pulling from ${shard}`);
      try {
        return await this.ref(shard).request<PullReply & Record<string, unknown>>('pull', req as unknown as Record<string, unknown>, {
          timeoutMs: this.opts.requestTimeoutMs, retries: req.min_round === null ? 2 : 0,
        });
      } catch (e) {
        if (isStalePlan(e) || !isRetryable(e)) throw e;
        const waited = Math.round((this.system.clock.monotonic() - started) / 1000);
        if (req.min_round !== null && e instanceof TimeoutError) {
          const s = await this.stats(shard, 2_000).catch(() => null);
          this.opts.log.warn({ shard, round: req.min_round, waited_s: waited, shard_round: s?.round ?? null, contributions: s?.pending_contributions ?? null, expected },
            `bsp round ${req.min_round}: still waiting for ${shard} to apply round ${req.min_round - 1}`
            + (s ? ` (it has applied ${s.round} rounds and holds ${s.pending_contributions} of ${expected ?? '?'} contributions)` : ' (its stats do not answer either)')
            + ` after ${waited} s; a worker that has died stalls bsp until fault tolerance lands`);
        } else {
          this.opts.log.warn({ shard, err: (e as Error).message, attempt }, `pull from ${shard} failed; retrying`);
          await this.system.clock.sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 4)));
        }
      }
    }
  }

  /** One logical push: every attempt carries the same seq. */
  async push(shard: string, req: PushRequest): Promise<PushReply> {
    const seq = this.system.nextSeq();
    const started = this.system.clock.monotonic();
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.ref(shard).request<PushReply & Record<string, unknown>>('push', req as unknown as Record<string, unknown>, {
          timeoutMs: this.opts.requestTimeoutMs, retries: 2, seq,
        });
      } catch (e) {
        if (isStalePlan(e) || !isRetryable(e)) throw e;
        if (this.opts.shouldStop()) throw new StopRequestedError(`stopped while pushing to ${shard}`, { cause: e });
        const waited = Math.round((this.system.clock.monotonic() - started) / 1000);
        this.opts.log.warn({ shard, err: (e as Error).message, waited_s: waited }, `push to ${shard} not answered yet; re-sending it (same seq, applied once)`);
        await this.system.clock.sleep(Math.min(2_000, 100 * 2 ** Math.min(attempt, 4)));
      }
    }
  }

  stats(shard: string, timeoutMs = this.opts.requestTimeoutMs): Promise<ShardStats> {
    return this.ref(shard).request<ShardStats & Record<string, unknown>>('stats', {}, { timeoutMs });
  }

  snapshot(shard: string, timeoutMs = 60_000): Promise<ShardSnapshot> {
    return this.ref(shard).request<ShardSnapshot & Record<string, unknown>>('snapshot', {}, { timeoutMs, retries: 2 });
  }
}

/**
 * Asks every shard for its stats until all answer. The error after
 * `timeoutMs` names the shards still missing.
 */
export async function waitForShards(system: ActorSystem, shards: readonly string[], opts: { timeoutMs: number; log: Logger | null }): Promise<void> {
  const missing = new Set(shards);
  const clock = system.clock;
  const start = clock.monotonic();
  let lastNote = start;
  while (missing.size) {
    await Promise.all([...missing].map(async (s) => {
      try {
        await system.ref('shard', s).request('stats', {}, { timeoutMs: 1_000 });
        missing.delete(s);
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
  /** The bound the shards enforce; null: measured only (asp, bsp). */
  max_staleness: number | null;
  per_shard: Record<string, { count: number; mean: number; max: number; refused: number; scaled: number }>;
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
  const out: StalenessSummary = { le: [], counts: [], count: 0, mean: 0, max: 0, refused: 0, scaled: 0, max_staleness: null, per_shard: {} };
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
    out.max_staleness = st.max_staleness;
    out.per_shard[shards[i]!] = { count: h.count, mean: h.count ? h.sum / h.count : 0, max: h.max, refused: st.stale_refused, scaled: st.stale_scaled };
  });
  out.mean = out.count ? sum / out.count : 0;
  return out;
}
