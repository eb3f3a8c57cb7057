/**
 * The driver's side of a run (`hetps up`): for workers listed without groups
 * (hps), wait for their profiles and group them (`waitForProfiles`,
 * `planJobGroups`); create the job — shard plan, batch descriptors of every
 * epoch, job info with the groups, in that order. The scheduler actor is
 * the one writer of the job; the monitor (actors/monitor/) follows training.
 */
import { HetpsError, TimeoutError, type Clock, type Logger, type Transport } from '../../runtime/mod.ts';
import {
  allWorkerNodes, groupingOptionsFromConfig, planGroups, syncSettingsForGroups,
  type GroupCentroid, type Grouping, type HetpsConfig, type NodeProfile, type ShardPlan, type WorkerGroupConfig,
} from '../../topology/mod.ts';
import { ackWaitFromConfig, type BatchDescriptor, type BatchQueue } from '../store/batch-queue.ts';
import { batchDescriptors, partitionHotness, shardingReport, shardPlanFromConfig, type ShardingReport } from '../node/config-bridge.ts';
import type { Evaluation } from '../../native-bridge/mod.ts';
import { jobGroupsFromConfig, type JobInfo, type JobInfoStore } from '../store/job-info.ts';
import type { ModelAndData } from '../node/nodes.ts';
import { waitOnWatch, type PlanStore } from '../store/plan-store.ts';
import type { ProfileStore } from '../store/profile-store.ts';
import { nodeProfileOf, subscribeTelemetry, type ProfileTelemetry } from '../monitor/telemetry.ts';

export interface PreparedJob {
  plan: ShardPlan;
  /** How the partitions were placed (hotness sharding's warm-up). */
  sharding: ShardingReport;
  /** The batches queued (a resume leaves out those done before it). */
  descriptors: BatchDescriptor[];
  info: JobInfo;
  /** Batches done before a resume (empty otherwise). */
  done?: ReadonlySet<string>;
}

/**
 * Waits until every one of `workers` has a profile in the store (each
 * worker puts one when it joins), on the store's watch. `onProgress` hears
 * the count whenever it changes and every 5 s; `check` may abort the wait (a
 * node process died), looked at every 500 ms. The timeout names the workers
 * still missing.
 */
export async function waitForProfiles(store: ProfileStore, workers: readonly string[], o: {
  clock: Clock; timeoutMs: number; onProgress?: (have: number, missing: string[]) => void; check?: () => string | null;
}): Promise<Map<string, ProfileTelemetry>> {
  const start = o.clock.monotonic();
  const have = await store.getMany(workers);
  const missing = () => workers.filter((w) => !have.has(w));
  o.onProgress?.(have.size, missing());
  if (missing().length === 0) return have;
  const aborted = (): Error | null => {
    const reason = o.check?.() ?? null;
    return reason === null ? null : new HetpsError(`waiting for the workers' profiles: ${reason} (missing: ${missing().join(', ')})`);
  };
  const abortedAtStart = aborted();
  if (abortedAtStart !== null) throw abortedAtStart;
  return waitOnWatch<Map<string, ProfileTelemetry>>({
    clock: o.clock, start, timeoutMs: o.timeoutMs,
    open: (settle) => store.watch((p) => {
      if (!workers.includes(p.node)) return;
      const count = have.size;
      have.set(p.node, p);
      if (have.size === count) return; // a newer profile of a worker already counted
      const left = missing();
      o.onProgress?.(have.size, left);
      if (left.length === 0) settle.done(have);
    }),
    onNote: () => o.onProgress?.(have.size, missing()),
    check: o.check ? aborted : null,
    timeout: () => {
      const left = missing();
      return new TimeoutError(`no profile from ${left.join(', ')} after ${Math.round(o.timeoutMs / 1000)} s (${have.size}/${workers.length} workers profiled). `
        + 'A worker publishes its profile when it starts, and hps groups cluster.worker_nodes by those profiles: start the missing workers '
        + '(hetps launch --role worker --node NAME …) or look at their logs for why they did not get that far', { data: { missing: left } });
    },
  });
}

/** The worker groups a job runs with, and how they were chosen (the summary's `grouping`). */
export interface JobGrouping {
  k: number;
  /** `config`: the YAML's worker_groups; `silhouette` / `fixed`: measured from the profiles (k chosen, or cluster.grouping.k). */
  criterion: Grouping['criterion'];
  score: number | null;
  reason: string;
  candidates: Grouping['candidates'];
  /** Fastest first for measured groups, with the sync settings of `syncSettingsForGroups` and the centroid; the YAML's as written. */
  groups: (WorkerGroupConfig & { centroid: GroupCentroid | null })[];
  /** The profiles grouped; empty for the YAML's groups. */
  profiles: NodeProfile[];
}

/**
 * The YAML's worker groups when it lists any; else the workers' profiles
 * grouped (`planGroups` with `cluster.grouping`) and given sync settings
 * (`syncSettingsForGroups`: the fastest group syncs every
 * `cluster.grouping.sync_steps`, slower ones after proportionally fewer
 * steps, a much slower last one runs async).
 */
export function planJobGroups(config: HetpsConfig, profiles: readonly NodeProfile[]): JobGrouping {
  const g = planGroups(config, profiles, groupingOptionsFromConfig(config));
  if (g.criterion === 'config') {
    return {
      k: g.k, criterion: g.criterion, score: g.score, reason: g.reason, candidates: g.candidates, profiles: [],
      groups: jobGroupsFromConfig(config).map((x) => ({ ...x, centroid: null })),
    };
  }
  const settings = syncSettingsForGroups(g, { syncSteps: config.cluster.grouping.sync_steps, asyncBelow: config.cluster.grouping.async_below });
  const centroidOf = new Map(g.groups.map((x) => [x.name, x.centroid]));
  return {
    k: g.k, criterion: g.criterion, score: g.score, reason: g.reason, candidates: g.candidates,
    groups: settings.map((x) => ({ ...x, centroid: centroidOf.get(x.name) ?? null })),
    profiles: [...profiles].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0)),
  };
}

/** Profiles from the store's messages, in `workers` order. */
export function profilesOf(found: ReadonlyMap<string, ProfileTelemetry>, workers: readonly string[]): NodeProfile[] {
  return workers.flatMap((w) => { const t = found.get(w); return t ? [nodeProfileOf(t)] : []; });
}

/** Plan first, then every batch, then the job info: a worker that sees the info finds all batches queued. */
export async function prepareJob(o: {
  config: HetpsConfig; runId: string; maxPayload: number; md: ModelAndData; planStore: PlanStore; jobStore: JobInfoStore; queue: BatchQueue;
  ackWaitMs?: number;
  /** The groups measured at start (`planJobGroups`); absent: the YAML's worker_groups. */
  groups?: WorkerGroupConfig[] | null;
  /** A resume: run once the plan is written and before any batch is queued (the shards' state restored). */
  beforeQueue?: (plan: ShardPlan) => Promise<void>;
  /**
   * Run once the plan is written and the batches queued, before the job info
   * — the workers' signal to start — is put (the start barrier: the servers
   * take the plan meanwhile).
   */
  beforeStart?: () => Promise<void>;
  /** A resume: batches done before it (left out of the queue and of total_batches). */
  done?: ReadonlySet<string>;
  /** A resume: the checkpoint it starts from (recorded in the job info, for a standby taking the run over). */
  resumedFrom?: string;
}): Promise<PreparedJob> {
  const { config } = o;
  // Hotness sharding's warm-up reads the same batches every time: a config and its data always give the same plan.
  const hot = partitionHotness(config, o.md);
  const loads = 'skipped' in hot ? null : hot.loads;
  let plan = shardPlanFromConfig(config, o.md.model, o.maxPayload, 1, loads);
  // A job name reused on a long-running NATS keeps its old plan: plans only move forward, so a different one gets the next version.
  const existing = await o.planStore.get().catch(() => null);
  if (existing !== null && (existing.version >= plan.version)) {
    const same = JSON.stringify({ ...existing, version: 0 }) === JSON.stringify({ ...plan, version: 0 });
    plan = shardPlanFromConfig(config, o.md.model, o.maxPayload, same ? existing.version : existing.version + 1, loads);
  }
  const sharding = shardingReport(config, o.md.model, o.maxPayload, plan, hot);
  await o.planStore.put(plan);
  await o.beforeQueue?.(plan);
  const done = o.done ?? new Set<string>();
  const descriptors = batchDescriptors(config, o.md.source).filter((d) => !done.has(d.batch_id));
  await o.queue.publish(descriptors);
  const workers = allWorkerNodes(config).map((n) => n.name);
  const info: JobInfo = {
    job: config.job.name,
    run_id: o.runId,
    mode: config.training.mode,
    workers,
    total_batches: descriptors.length,
    rounds: Math.ceil(descriptors.length / workers.length),
    epochs: config.data.epochs,
    batch_size: config.data.batch_size,
    ack_wait_ms: o.ackWaitMs ?? ackWaitFromConfig(config.fault_tolerance),
    recovery_timeout_ms: Math.round(config.fault_tolerance.worker_recovery_timeout * 1000),
    groups: o.groups ? o.groups.map(({ name, nodes, sync_mode, sync_steps, accumulation_steps, adaptive_threshold }) =>
      ({ name, nodes: [...nodes], sync_mode, sync_steps, accumulation_steps, adaptive_threshold })) : jobGroupsFromConfig(config),
    groups_version: 0,
    resume_version: 0,
    paused: false,
    rejoining: [],
    standbys: [...config.fault_tolerance.standby_workers],
    ...(o.resumedFrom !== undefined ? { resumed_from: { checkpoint: o.resumedFrom, batches_done: done.size } } : {}),
  };
  await o.beforeStart?.();
  await o.jobStore.put(info);
  return { plan, sharding, descriptors, info, done };
}

