/**
 * A node of the YAML brought up inside an ActorSystem: a server node hosts
 * its shard, a worker node its worker actor. The same code runs in a
 * `hetps launch` process (over NATS), inside `hetps up` in embedded mode (all
 * nodes in one process on the in-process bus) and under the API. Each waits
 * for what it needs (plan, job info, shards), so nodes and driver may start
 * in any order. A worker first measures itself and publishes its profile
 * (actors/node/profile-reporter.ts): the driver groups `cluster.worker_nodes` by
 * those profiles before it writes the job info.
 */
import { ConfigError, TimeoutError, type ActorSystem, type Clock, type Logger } from '../../runtime/mod.ts';
import { DEFAULT_MAX_STALENESS, allWorkerNodes, describeMaxStaleness, heldBandwidthMbps, rowsMaxStaleness, nodeOverrides, replicasOn, standbyWorkerNodes, type GradientCompressionSetting, type GroupLrRule, type HetpsConfig, type ShardPlan, type StalenessPolicy, type WorkerNode } from '../../topology/mod.ts';
import { initDenseParams, type CtrModel, type DataSource, type DeviceProfile, type ExecutionProvider, type MlpModel } from '../../native-bridge/mod.ts';
import type { BatchQueue } from '../store/batch-queue.ts';
import {
  EMBEDDING_INIT_SCALE, WIDE_TABLE, dataSourceFromConfig, modelFromConfig, optimizerInput, sparseLayoutFromConfig,
} from './config-bridge.ts';
import { groupOfWorker, waitForJobInfo, waitForJobInfoWhere, type JobInfo, type JobInfoStore } from '../store/job-info.ts';
import { waitOnWatch, type PlanStore } from '../store/plan-store.ts';
import type { NetworkProbe } from './node-profile.ts';
import { ProfileReporter } from './profile-reporter.ts';
import type { ProfileStore } from '../store/profile-store.ts';
import { ShardState } from '../shard/shard.actor.ts';
import { ShardHost } from '../shard/shard-host.ts';
import { waitForShards } from '../worker/shard-client.ts';
import { createWorkerActor, type WorkerActorDefinition } from '../worker/worker.actor.ts';
import type { HealthView } from '../health/health.types.ts';
import type { LocalOptimizers } from '../worker/local-updates.ts';

/** How long a node waits for the driver (plan, job info) and for the shards, by default. */
export const DEFAULT_NODE_WAIT_MS = 120_000;

/**
 * Waits on the plan store's watch until a plan is there; a note every 5 s while it is not.
 * With `server`, only a plan that names that server node ends the wait: a
 * plan without it is an earlier run's (the driver writes this run's once it
 * has created the job — after the workers' profiles where the groups are
 * measured, and a node may start before the driver), so the server waits
 * for the next one rather than giving up on the first it reads; past the
 * timeout the error names the plan it saw.
 */
export async function waitForPlan(store: PlanStore, opts: { clock: Clock; timeoutMs: number; log: Logger | null; server?: string }): Promise<ShardPlan> {
  const server = opts.server;
  let without: ShardPlan | null = null;
  return waitOnWatch<ShardPlan>({
    clock: opts.clock, start: opts.clock.monotonic(), timeoutMs: opts.timeoutMs,
    // The watch hands over the stored plan first; a store it cannot read yet, or a value that is not a plan, is only noted.
    open: async (settle) => store.watch((plan) => {
      if (server === undefined || plan.placement.servers.includes(server)) settle.done(plan);
      else without = plan;
    }, (e) => opts.log?.debug({ err: e.message }, 'plan store not readable yet')),
    onNote: () => opts.log?.info(without === null
      ? 'waiting for the shard plan (start `hetps up` for this job)'
      : `waiting for a shard plan with server ${server}: plan v${without.version} (servers: ${without.placement.servers.join(', ')}) is an earlier run's, or \`hetps up\` runs another config`),
    timeout: () => without === null
      ? new TimeoutError(`no shard plan after ${Math.round(opts.timeoutMs / 1000)} s: the driver (hetps up) has not created this job yet`)
      : new ConfigError(`server "${server}" is not a server node of plan v${without.version} (servers: ${without.placement.servers.join(', ')}), and no plan naming it came within ${Math.round(opts.timeoutMs / 1000)} s: `
        + 'start `hetps up` with the config this node has, or leave the node out of cluster.server_nodes'),
  });
}

/** The model and data a config describes, built once per process (the spam corpus loads in about a second). */
export interface ModelAndData {
  source: DataSource;
  model: CtrModel | MlpModel;
}

export function modelAndData(config: HetpsConfig): ModelAndData {
  const source = dataSourceFromConfig(config);
  return { source, model: modelFromConfig(config, source) };
}

/**
 * How the shards judge stale pushes: in hps (async between groups) they
 * scale pushes staler than training.staleness_tolerance down and refuse
 * those beyond training.max_staleness (topology/staleness.ts); asp
 * and bsp keep measuring only.
 */
export function stalenessPolicyFromConfig(config: HetpsConfig): StalenessPolicy | null {
  if (config.training.mode !== 'hps') return null;
  const t = config.training.staleness_tolerance;
  const m = config.training.max_staleness;
  const bounds = typeof m === 'object'
    ? { maxStaleness: m.dense ?? DEFAULT_MAX_STALENESS, sparseMaxStaleness: m.sparse ?? DEFAULT_MAX_STALENESS }
    : { maxStaleness: m };
  return typeof t === 'object'
    ? { ...bounds, scaling: 'inverse', tolerance: t.dense ?? 'auto', sparseTolerance: t.sparse ?? 'auto' }
    : { ...bounds, scaling: 'inverse', tolerance: t };
}

/** hps: the learning-rate rule for a group's updates (topology/group-lr.ts); null in asp and bsp, or when `none`. */
export function groupLrRuleFromConfig(config: HetpsConfig): GroupLrRule | null {
  return config.training.mode === 'hps' && config.training.group_lr_scaling !== 'none'
    ? { scaling: config.training.group_lr_scaling, warmupWindows: config.training.group_lr_warmup_windows }
    : null;
}

/**
 * communication.compression as a worker applies it: `fp16` sends gradients
 * (pushes, group slices) as scaled halves; `adaptive` does so while the
 * worker's link utilisation is above compression_threshold
 * (topology/compression.ts); `none` (mode null) sends float32.
 */
export function gradientCompressionFromConfig(config: HetpsConfig): GradientCompressionSetting {
  const c = config.communication;
  return { mode: c.compression === 'none' ? null : c.compression, threshold: c.compression_threshold };
}

/** gradientCompressionFromConfig as a worker's (and its stepper's) options. */
export function workerCompressionOptions(config: HetpsConfig): { compression: GradientCompressionSetting['mode']; compressionThreshold: number; compressPulls: boolean } {
  const { mode, threshold } = gradientCompressionFromConfig(config);
  return { compression: mode, compressionThreshold: threshold, compressPulls: config.communication.compress_pulls };
}

/** The bandwidth of a worker's link to NATS as its profile measured it (adaptive compression counts bytes at it); null without a profile or a NATS link. */
export function measuredLinkMbps(reporter: ProfileReporter | null): number | null {
  if (reporter === null) return null;
  const { link, bandwidth_mbps } = reporter.profile;
  return link === 'nats' ? bandwidth_mbps : null;
}

/** hps with training.local_updates: the optimizers a member applies to its own copy between a window's steps (actors/worker/local-updates.ts); null otherwise. */
export function localOptimizersFromConfig(config: HetpsConfig): LocalOptimizers | null {
  if (config.training.mode !== 'hps' || !config.training.local_updates) return null;
  return { dense: optimizerInput(config.optimizer), sparse: config.model.type === 'ctr' ? optimizerInput(config.optimizer.sparse) : null };
}

/** Spawns the shard of `server` once the plan is there. */
export async function startServerNode(o: {
  config: HetpsConfig; server: string; system: ActorSystem; planStore: PlanStore; log: Logger; md?: ModelAndData; waitMs?: number;
  /** Profile on join, published once (a server has no steps to time; servers are not grouped); null or absent: none. */
  profiling?: WorkerProfiling | null;
}): Promise<{ plan: ShardPlan; host: ShardHost }> {
  const { config, server, system } = o;
  if (!config.cluster.server_nodes.includes(server)) {
    throw new ConfigError(`server "${server}" is not in cluster.server_nodes of ${config.source.file} (${config.cluster.server_nodes.join(', ')})`);
  }
  if (o.profiling) (await profileOnJoin(o.profiling, { config, node: server, system, log: o.log, provider: 'cpu' })).stop();
  const { model } = o.md ?? modelAndData(config);
  // A plan that does not name this server (an earlier run's, on a resume onto more servers) is waited past.
  const plan = await waitForPlan(o.planStore, { clock: system.clock, timeoutMs: o.waitMs ?? DEFAULT_NODE_WAIT_MS, log: o.log, server });
  // The same initial values as train-local: He-initialised from training.random_seed, rows from (seed, table, id).
  const initialDense = initDenseParams(model, config.training.random_seed);
  const sparseSettings = model.family === 'ctr' ? config.optimizer.sparse : config.optimizer;
  const policy = stalenessPolicyFromConfig(config);
  const host = new ShardHost({
    node: server, system, planStore: o.planStore, log: o.log,
    replication: config.fault_tolerance.replication, lagLimit: config.fault_tolerance.replication_lag,
    newState: (shard, p) => new ShardState({
      shard, plan: p, initialDense,
      denseOptimizer: optimizerInput(config.optimizer),
      sparseOptimizer: optimizerInput(sparseSettings),
      sparseInitScale: EMBEDDING_INIT_SCALE,
      sparseInitScaleByTable: { [WIDE_TABLE]: 0 },
      seed: config.training.random_seed,
      clock: system.clock,
      staleness: policy,
    }),
  });
  await host.start(plan);
  const held = replicasOn(plan.placement, server);
  const bounds = policy === null ? null : describeMaxStaleness(policy.maxStaleness, rowsMaxStaleness(policy));
  o.log.info({ node: server, plan_version: plan.version, replicas: held, replication: config.fault_tolerance.replication, max_staleness: bounds },
    `server ${server} holds ${held.map((r) => `${r.shard} (${r.role})`).join(', ') || 'no replica yet'}`
    + (bounds === null ? '' : ` (hps: stale pushes at lr/(1+s), refused beyond max_staleness ${bounds})`));
  return { plan, host };
}

export function workerNodeOf(config: HetpsConfig, group: string, rank: number): WorkerNode {
  const g = config.cluster.worker_groups.find((x) => x.name === group);
  if (!g) throw new ConfigError(`group "${group}" is not in cluster.worker_groups of ${config.source.file} (${config.cluster.worker_groups.map((x) => x.name).join(', ')})`);
  if (!Number.isInteger(rank) || rank < 0 || rank >= g.nodes.length) {
    throw new ConfigError(`--node-rank ${rank} is out of range: group "${group}" has ${g.nodes.length} node(s) (ranks 0..${g.nodes.length - 1})`);
  }
  return allWorkerNodes(config).find((n) => n.group === group && n.rank === rank)!;
}

/** A worker by name: one in a group of the YAML, a `cluster.worker_nodes` entry (its group is measured at start), or a standby. */
export function workerNodeByName(config: HetpsConfig, name: string): WorkerNode {
  const all = [...allWorkerNodes(config), ...standbyWorkerNodes(config)];
  const n = all.find((w) => w.name === name);
  if (!n) throw new ConfigError(`worker "${name}" is not in ${config.source.file} (its workers: ${all.map((w) => w.name).join(', ')})`);
  return n;
}

/** How a node profiles itself when it joins (actors/node/profile-reporter.ts); the probe times default to `cluster.profiling`. */
export interface WorkerProfiling {
  store: ProfileStore;
  probeSeconds?: number;
  republishMs?: number;
  /** A device profile shared by the nodes of one machine (embedded mode, `hetps up`'s processes); absent: the node measures its own. */
  device?: ((provider: ExecutionProvider) => Promise<DeviceProfile>) | null;
  /** Likewise the network to NATS; absent: the node measures its own. */
  network?: NetworkProbe | null;
}

export interface StartedWorker {
  def: WorkerActorDefinition;
  info: JobInfo;
  plan: ShardPlan;
}

/** Waits for the job info, the plan and every shard, then spawns the worker actor (its loop starts at once). */
export async function startWorkerNode(o: {
  config: HetpsConfig; node: WorkerNode; system: ActorSystem; planStore: PlanStore; jobStore: JobInfoStore; queue: BatchQueue;
  log: Logger; md?: ModelAndData; runId?: string | null; waitMs?: number;
  /** Profile on join and while training; null or absent: no profile (the driver then cannot group this node by measurement). */
  profiling?: WorkerProfiling | null;
  /** The health actor's verdicts, which the worker's hps group acts on; null or absent: none. */
  health?: HealthView | null;
  /** How long a worker paused for a regroup waits for the resume (default 120 s); a ctl.pause has no limit. */
  regroupResumeTimeoutMs?: number;
  /** The node is a standby of the job: called before it waits for a place (its heartbeat says `standby`). */
  onStandby?: () => void;
  /** How often the worker publishes its progress telemetry (default 2 s; the tail dispatch measures rates from it). */
  progressIntervalMs?: number;
}): Promise<StartedWorker> {
  const { config, node, system, log } = o;
  const waitMs = o.waitMs ?? DEFAULT_NODE_WAIT_MS;
  // Data and model first, so a node started early is ready the moment the job appears.
  const { source, model } = o.md ?? modelAndData(config);
  const overrides = nodeOverrides(config, node.name);
  const reporter = o.profiling ? await profileOnJoin(o.profiling, { config, node: node.name, system, log, provider: overrides.provider ?? 'cpu' }) : null;
  let info: JobInfo;
  let plan: ShardPlan;
  try {
    reporter?.keepStored();
    info = await waitForJobInfo(o.jobStore, {
      clock: system.clock, timeoutMs: waitMs, runId: o.runId ?? null,
      onWait: (ms) => log.info(ms === 0 ? `worker ${node.name} ready; waiting for the job` : `worker ${node.name} still waiting for the job (start \`hetps up\` for it)`),
    });
    reporter?.stopRefreshing();
    if (!info.workers.includes(node.name) && info.standbys.includes(node.name)) {
      // A standby: warm (data and model loaded, profiled), it trains nothing until the driver gives it a dead member's place.
      o.onStandby?.();
      log.info(`standby ${node.name}: warm and waiting to take the place of a dead group member`);
      info = await waitForJobInfoWhere(o.jobStore, info.run_id, (i) => i.workers.includes(node.name) && i.resume_version >= i.groups_version);
      const g = groupOfWorker(info, config, node.name);
      log.info({ group: g.name, groups_version: info.groups_version }, `standby ${node.name}: takes a place in group ${g.name} (${g.nodes.join(', ')})`);
    }
    if (!info.workers.includes(node.name)) throw new ConfigError(`worker ${node.name} is not one of the job's workers (${info.workers.join(', ')}): a different config than the driver's?`);
    plan = await waitForPlan(o.planStore, { clock: system.clock, timeoutMs: waitMs, log });
    await waitForShards(system, plan, { timeoutMs: waitMs, log });
  } catch (e) {
    reporter?.stop();
    throw e;
  }
  const groupSync = info.mode === 'hps' ? groupOfWorker(info, config, node.name) : null;
  const def = createWorkerActor({
    node: node.name, group: groupSync?.name ?? node.group ?? UNGROUPED, job: info, plan, queue: o.queue, source, model,
    layout: sparseLayoutFromConfig(config, model),
    provider: overrides.provider ?? 'cpu',
    // One thread per worker by default: several workers share a machine here, and small towers gain nothing from more.
    threads: overrides.threads ?? 1,
    emulateSpeed: overrides.emulate?.speed ?? null,
    referenceStepMs: config.training.emulation_reference_step_ms,
    bandwidthMbps: heldBandwidthMbps(overrides.emulate),
    measuredBandwidthMbps: measuredLinkMbps(reporter),
    groupSync,
    groupLr: groupLrRuleFromConfig(config),
    streamSlices: config.training.stream_slices,
    directPush: config.training.group_update === 'direct',
    localOptimizers: localOptimizersFromConfig(config),
    ...workerCompressionOptions(config),
    tailDispatch: config.training.mode !== 'bsp' && config.training.tail_dispatch,
    planStore: o.planStore,
    health: o.health ?? null,
    ...(o.regroupResumeTimeoutMs !== undefined ? { regroupResumeTimeoutMs: o.regroupResumeTimeoutMs } : {}),
    ...(o.progressIntervalMs !== undefined ? { progressIntervalMs: o.progressIntervalMs } : {}),
    jobStore: o.jobStore,
    onBatchTrained: reporter ? (t) => reporter.noteStep(t.emulated_step_ms ?? t.busy_ms) : null,
  });
  try {
    await system.spawn(def);
  } catch (e) {
    reporter?.stop();
    throw e;
  }
  if (reporter) {
    reporter.startTraining();
    void def.done.finally(() => reporter.stop());
  }
  log.info({ node: node.name, group: groupSync?.name ?? node.group, mode: info.mode, rounds: info.mode === 'bsp' ? info.rounds : null }, 'worker training');
  return { def, info, plan };
}

/** The group label of a `worker_nodes` entry in asp / bsp, which have no groups. */
export const UNGROUPED = 'ungrouped';

async function profileOnJoin(p: WorkerProfiling, o: { config: HetpsConfig; node: string; system: ActorSystem; log: Logger; provider: ExecutionProvider }): Promise<ProfileReporter> {
  const { config, system, log } = o;
  const reporter = await ProfileReporter.join({
    transport: system.transport, job: config.job.name, node: o.node, emulate: nodeOverrides(config, o.node).emulate, provider: o.provider,
    store: p.store, clock: system.clock, log,
    probeSeconds: p.probeSeconds ?? config.cluster.profiling.probe_seconds,
    republishMs: p.republishMs ?? config.cluster.profiling.republish_seconds * 1000,
    device: p.device ?? null,
    network: p.network ?? null,
  });
  const t = reporter.profile;
  log.info({
    matmul_gflops: t.matmul_gflops, gather_rows_per_s: t.gather_rows_per_s, bandwidth_mbps: t.bandwidth_mbps, rtt_ms: t.rtt_ms, variance: t.variance,
    link: t.link, emulated: t.emulated, probe_ms: t.probe_ms,
    device_from: t.device_from, network_from: t.network_from,
  }, `${t.device_from === 'node' || t.network_from === 'node' ? `profiled ${o.node} in ${t.probe_ms} ms` : `profile of ${o.node}`}`
    + `${t.device_from === 'host' ? ` (${t.network_from === 'host' ? 'device and network' : 'device'}: this machine's, measured once for the nodes it runs)` : ''}`
    + `${t.emulated ? ` (EMULATED: compute scaled by emulate.speed${t.link === 'emulated' ? ', link by emulate.bandwidth_mbps' : ''})` : ''}; published`);
  return reporter;
}
