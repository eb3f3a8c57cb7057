/**
 * The end-of-run integrity check of `hetps up`: every acknowledged batch's
 * update applied exactly once on the final primaries, and the replicas of
 * each shard in the same state.
 *
 * Every replica logs the batch ids of the pushes it applied (and of those it
 * refused as too stale: deliberately dropped, reported by the hps staleness
 * rule, not lost). A shard that owns dense blocks takes part in every
 * training step, so each acknowledged batch must be in its log exactly once:
 * - `lost`: acknowledged batches missing from some such shard's log;
 * - `duplicated`: batches applied more than once on some shard;
 * - `replicas_equal`: the SHA-256 of the state (values, optimizer state,
 *   steps, version) is the same on each shard's primary and backups.
 */
import type { ActorSystem, Clock, Logger } from '../../runtime/mod.ts';
import { replicaNodes, type ShardPlan } from '../../topology/mod.ts';
import type { IntegrityReply } from '../shard/shard.messages.ts';
import { replicaId } from '../shard/replica.ts';

export interface IntegrityReport {
  acked: number;
  /** Acknowledged batches found in the log of every shard that owns dense blocks. */
  applied: number;
  lost: number;
  duplicated: number;
  replicas_equal: boolean | null;
  /** Acknowledged batches a shard refused as too stale (hps; dropped by rule, not lost). */
  dropped_stale: number;
  /** Examples, for the log: up to 10 each. */
  lost_examples: string[];
  duplicated_examples: string[];
  /** Per shard: its final primary, its backups' hashes agreeing, and what async replication had not confirmed yet. */
  per_shard: Record<string, { primary: string; replicas: number; equal: boolean | null; unreplicated: number; version: number; unanswered: string[] }>;
}

export async function checkIntegrity(o: {
  system: ActorSystem; plan: ShardPlan; acked: ReadonlySet<string>; clock: Clock; log: Logger | null;
  /** How long to wait for async replicas to confirm everything; default 5 s. */
  settleMs?: number;
}): Promise<IntegrityReport> {
  const { plan } = o;
  // Paged: a log over the message limit comes in parts (integrity_part), each fetched in turn.
  const ask = async (shard: string, node: string): Promise<IntegrityReply | null> => {
    const ref = o.system.ref('shard', replicaId(shard, node));
    try {
      const r = await ref.request<IntegrityReply & Record<string, unknown>>('integrity', { paged: true }, { timeoutMs: 10_000, retries: 1 });
      if (r.applied_token === undefined) return r;
      const applied: Record<string, number> = {};
      for (let index = 0; index < (r.applied_parts ?? 0); index++) {
        const part = await ref.request<{ applied: [string, number][] }>('integrity_part', { token: r.applied_token, index }, { timeoutMs: 10_000, retries: 1 });
        for (const [b, n] of part.applied) applied[b] = n;
      }
      return { ...r, applied };
    } catch (e) {
      o.log?.warn({ shard, node, err: (e as Error).message }, 'replica did not answer the integrity check');
      return null;
    }
  };
  const denseShards = new Set(plan.dense.map((b) => b.shard));
  const lost = new Set<string>();
  const duplicated = new Set<string>();
  const droppedStale = new Set<string>();
  const perShard: IntegrityReport['per_shard'] = {};
  let allEqual: boolean | null = true;
  const appliedEverywhere = new Set(o.acked);
  for (const shard of plan.shards) {
    const r = plan.placement.replicas[shard]!;
    const deadline = o.clock.monotonic() + (o.settleMs ?? 5_000);
    let primary = await ask(shard, r.primary);
    while (primary !== null && primary.unreplicated > 0 && o.clock.monotonic() < deadline) {
      await o.clock.sleep(100);
      primary = await ask(shard, r.primary);
    }
    const others = await Promise.all(r.backups.map((n) => ask(shard, n)));
    const unanswered = [r.primary, ...r.backups].filter((_, i) => (i === 0 ? primary : others[i - 1]) === null);
    let equal: boolean | null = null;
    if (primary !== null) {
      equal = others.every((b) => b !== null && b.hash === primary!.hash);
      for (const [b, n] of Object.entries(primary.applied)) if (n > 1) duplicated.add(b);
      if (denseShards.has(shard)) {
        const refused = new Set(primary.refused);
        for (const b of o.acked) {
          if (primary.applied[b] !== undefined) continue;
          appliedEverywhere.delete(b);
          if (refused.has(b)) droppedStale.add(b);
          else lost.add(b);
        }
      }
    } else {
      for (const b of o.acked) appliedEverywhere.delete(b);
    }
    if (equal === false) allEqual = false;
    else if (equal === null && allEqual === true) allEqual = null;
    perShard[shard] = {
      primary: r.primary, replicas: replicaNodes(r).length, equal, unreplicated: primary?.unreplicated ?? 0, version: primary?.version ?? -1, unanswered,
    };
  }
  return {
    acked: o.acked.size, applied: appliedEverywhere.size, lost: lost.size, duplicated: duplicated.size, replicas_equal: allEqual,
    dropped_stale: droppedStale.size,
    lost_examples: [...lost].slice(0, 10), duplicated_examples: [...duplicated].slice(0, 10), per_shard: perShard,
  };
}
