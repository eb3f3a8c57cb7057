/**
 * A whole job on this machine, as `hetps up` runs it: starts a local 3-node
 * NATS cluster (unless `nats.servers` is given), starts one `hetps launch`
 * process per node of the YAML (each worker profiles itself as it joins; hps
 * groups `cluster.worker_nodes` by those profiles), creates the job (shard
 * plan, the batch work queue with every epoch's batches, job info with the
 * groups), supervises training, evaluates the trained parameters on the test
 * split, stops everything and writes a summary.
 *
 * Without a `nats-server` binary (and without `nats.servers`), or with
 * `embedded`, the same actors run in this one process on the in-process bus,
 * with an in-memory work queue and plan store.
 *
 * Over NATS the driver holds the job's scheduler lease (actors/scheduler/
 * lease.ts) from before it writes anything of the job. `runStandby` is
 * `hetps up --standby`: a second driver that counts the acknowledgements
 * from its start, waits on the lease, and when the active driver stops
 * renewing it (its process died) takes the job over: it reads the job from
 * its stores, starts the control plane and supervises the job to its end as
 * the active driver would have. Training does not wait for it: workers,
 * shards and JetStream go on without a scheduler.
 *
 * Everything it says goes through a `JobPrinter`; the command line prints.
 */
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { randomUUID } from 'node:crypto';
import { findNatsServer, startLocalCluster, type LocalCluster } from './local-cluster.ts';
import { NetLab } from './netlab.ts';
import { writeAuthFiles } from './auth.ts';
import {
  ConfigError, HetpsError, JSON_CONTENT_TYPE, MissingDependencyError, controlSubject, systemClock, type Actor, type NatsAuth, type NatsTls,
} from '../runtime/mod.ts';
import { allWorkerNodes, balancerIdleReason, describeMaxStaleness, groupsMeasuredAtStart, inactiveSettings, natsConnectionAs, serverCapacities, tcLinkedNodes, type HetpsConfig, type NodeProfile, type ShardPlan } from '../topology/mod.ts';
import type { Evaluation } from '../native-bridge/mod.ts';
import { replicaId } from '../actors/shard/replica.ts';
import { ackWaitFromConfig } from '../actors/store/batch-queue.ts';
import { batchDescriptors, checkpointModelOf, partitionHotness, shardingReport, sparseLayoutFromConfig, type ShardingReport } from '../actors/node/config-bridge.ts';
import { natsJobInfoStore, waitForJobInfo, type JobInfo } from '../actors/store/job-info.ts';
import { planJobGroups, prepareJob, profilesOf, waitForProfiles, type JobGrouping, type PreparedJob } from '../actors/scheduler/job.ts';
import {
  TrainingMonitor, type CurvePoint, type TrainingProgress, type TrainingReport, type UtilisationReport,
} from '../actors/monitor/training-monitor.ts';
import { EVAL_BATCH_MIN, ShardEvaluator, evaluateOnShards } from '../actors/monitor/evaluate.ts';
import { DEFAULT_NODE_WAIT_MS, gradientCompressionFromConfig, modelAndData } from '../actors/node/nodes.ts';
import { RegroupController, type RegroupRecord } from '../actors/scheduler/regroup.ts';
import { startControlPlane, type ControlPlane } from '../actors/scheduler/control-plane.ts';
import { createMonitorActor } from '../actors/monitor/monitor.actor.ts';
import { TELEMETRY_LOG, newDashboardToken } from '../actors/monitor/monitor-http.ts';
import { LeaseStandby, leaseBucketName, type LeaseHolder, type TakeoverRecord } from '../actors/scheduler/lease.ts';
import { ShardFailover, createFailoverActor, type FailoverRecord, type ReplicaRecord } from '../actors/scheduler/failover.ts';
import { checkIntegrity, type IntegrityReport } from '../actors/scheduler/integrity.ts';
import { PlanView } from '../actors/store/plan-view.ts';
import { natsPlanStore } from '../actors/store/plan-store.ts';
import { publishEvent } from '../actors/monitor/monitor.messages.ts';
import { ShardClient, shardStalenessSummary, waitForShards, type StalenessSummary } from '../actors/worker/shard-client.ts';
import { lineLogger } from './node-processes.ts';
import { cpuBetween, cpuSnapshot, type CpuReport, type CpuSnapshot } from './process-cpu.ts';
import type { JobBackend, JobContext, JobPrinter } from './job-backend.ts';
import { connectDriver, natsBackend, natsStandbyBackend } from './nats-backend.ts';
import { embeddedBackend } from './embedded-backend.ts';
import { setupStep } from './setup-step.ts';
import { Checkpointer, type CheckpointTaken } from '../actors/scheduler/checkpointer.ts';
import { LoadBalancer, type LoadBalancingReport } from '../actors/scheduler/load-balancer.ts';
import { CutMoment } from '../actors/scheduler/cut-moment.ts';
import { checkpointRoot, readManifest, type CheckpointManifest, type ResumePoint } from '../actors/store/checkpoint.ts';
import { restoreOntoPlan } from '../actors/store/checkpoint-reshard.ts';
import type { ShardSnapshot } from '../actors/shard/shard.messages.ts';

/** A control command the driver sends itself during training, as any NATS client would. */
export interface ControlCommand {
  after_batches: number;
  command: string;
  body: Record<string, unknown>;
}

export interface ControlReply { after_batches: number; command: string; reply: unknown }

/** A parsed and validated `hetps up` command line. */
export interface JobRunOptions {
  /** The config (loaded, `--job` applied) and where it came from. */
  config: HetpsConfig;
  configPath: string;
  /** The config file as the user wrote it. */
  configArg: string;
  /** Also write the summary here. */
  summaryPath: string | null;
  embedded: boolean;
  /** false: start no node processes. */
  launch: boolean;
  skip: ReadonlySet<string>;
  /** Seconds between evaluations on a test subset while training runs; 0: off. */
  evalEveryS: number;
  evalSamples: number;
  /** null: no control script (and no `control_replies` in the summary). */
  ctlScript: ControlCommand[] | null;
  /** `--resume`: the checkpoint the job starts from (its shards restored, its done batches not queued). */
  resume?: ResumePoint | null;
  /** Log level; default HETPS_LOG_LEVEL, else logging.level of the config. */
  level?: string;
}

/** A parsed `hetps up --standby` command line. */
export interface StandbyRunOptions {
  /** The config of the job (the same as its active driver's); `nats.servers` says where the job runs. */
  config: HetpsConfig;
  configPath: string;
  configArg: string;
  summaryPath: string | null;
  evalEveryS: number;
  evalSamples: number;
  level?: string;
}

/** Who ran the job's control plane: the summary's `scheduler`. */
export interface SchedulerReport {
  /** How long the holder may go without renewing the lease before a standby takes over, ms; null embedded (no lease). */
  lease_ms: number | null;
  /** The driver that ended the job (`driver@<host>:<pid>`); null embedded. */
  holder: string | null;
  /** Each takeover of the job by a standby, in order. */
  takeovers: TakeoverRecord[];
  /**
   * Where this driver's exactly-once accounting starts: `job_start` (it
   * listened before the job was created: every acknowledgement is counted),
   * or `standby_start` (a standby started after the job was created:
   * acknowledgements before its start are missing from batches_acked).
   */
  acks_seen_from: 'job_start' | 'standby_start';
}

export interface UpSummary {
  mode: 'bsp' | 'asp' | 'hps';
  samples: number;
  samples_per_s: number;
  test_auc: number | null;
  test_logloss: number;
  test_accuracy?: number;
  /**
   * Mean training loss of the last 10 % of acknowledged batches (sample-weighted), each computed before
   * its update: with one epoch, a held-out estimate (progressive validation); null when none.
   */
  final_train_loss: number | null;
  wall_s: number;
  transport: 'nats' | 'embedded';
  batches: number;
  batches_acked: number;
  duplicate_acks: number;
  job: string;
  run_id: string;
  run_dir: string;
  train_s: number;
  unconfirmed_acks: number;
  redelivered: number;
  /** Batches acknowledged per worker: faster workers take more. */
  per_worker: Record<string, number>;
  /** nodes.<name>.emulate.speed of the emulated nodes. */
  emulated: Record<string, number>;
  nats: string[] | null;
  not_active: string[];
  /** Seconds between the periodic evaluations; null: none ran. */
  eval_every_s: number | null;
  /** Test samples each periodic evaluation scored (the first of the test split). */
  eval_samples: number | null;
  /** Test loss on that subset during training: one point at the start, every eval_every_s, one at the end. Empty without --eval-every. */
  curve: CurvePoint[];
  /** When the run's first training step began, seconds on the curve's time axis (from the first worker loop's start); null if unknown. */
  first_step_s: number | null;
  /** Busy time / training window per worker. */
  utilisation: UtilisationReport;
  /** CPU time of the job's processes over the training window. */
  cpu: CpuReport | null;
  /** The shards' push staleness histogram (hps: with the pushes scaled and refused); null when the shards did not answer. */
  staleness: StalenessSummary | null;
  /** hps: the regroups during training (ctl.regroup commands and automatic ones), in order. */
  regroups: RegroupRecord[];
  /** The checkpoints taken (ctl.checkpoint, checkpoint.every_s, the end of the job), in order. */
  checkpoints: CheckpointTaken[];
  /** `--resume`: the checkpoint the job started from and the batches done before it (counted in `batches`, not in `batches_acked`). */
  resumed_from?: { checkpoint: string; batches_done: number };
  /** hps: batches acknowledged per worker per group it trained them in. */
  per_worker_group: Record<string, Record<string, number>>;
  /** --ctl-script: each command sent and the reply it got (absent without the flag). */
  control_replies?: ControlReply[];
  /**
   * hps: the groups the job started with and how they were chosen: `criterion`
   * `config` for the YAML's worker_groups, `silhouette` or `fixed` for
   * cluster.worker_nodes grouped by the workers' profiles (listed in
   * `profiles`). null in asp / bsp.
   */
  grouping: JobGrouping | null;
  /** The end-of-run integrity check (actors/scheduler/integrity.ts); null when it could not run. */
  integrity: IntegrityReport | null;
  /** Shard replication and the failovers of the run. */
  replication: {
    backup_factor: number;
    mode: 'sync' | 'async';
    failovers: FailoverRecord[];
    replicas_added: ReplicaRecord[];
    shards_lost: string[];
    /** Shards with no backup at the end (a failure of their primary would lose them). */
    unprotected: string[];
    /** Requests the driver's client re-sent after a stale plan or silence. */
    client_reroutes: number;
  };
  /**
   * load_balancing: the shards' primaries moved between server nodes while
   * training ran, and the last loads measured; null where it did not run
   * (load_balancing.enabled false, or the embedded mode's one process).
   */
  load_balancing: LoadBalancingReport | null;
  /**
   * How the sparse partitions were placed: hotness sharding's warm-up (the
   * batches read, the floats per batch each shard is expected to move, their
   * imbalance and the round-robin plan's under the same statistics), or why not.
   */
  sharding: ShardingReport;
  /** The scheduler lease and the takeovers of the run. */
  scheduler: SchedulerReport;
}

/** The not-active report: the file's inactive settings. */
export function notActiveReport(config: HetpsConfig): string[] {
  return inactiveSettings(config);
}

function progressText(p: TrainingProgress, mode: string): string {
  const pct = p.total_samples > 0 ? Math.floor((100 * p.samples) / p.total_samples) : 100;
  return `training (${mode}): ${p.samples}/${p.total_samples} samples (${pct}%)  ${Math.round(p.samples_per_s)} samples/s  `
    + `loss ${p.loss === null ? '   -  ' : p.loss.toFixed(4)}${p.test_loss === null ? '' : `  test loss ${p.test_loss.toFixed(4)}`}  `
    + `batches ${p.batches_acked}/${p.total_batches}  ${p.elapsed_s.toFixed(0)} s`;
}

// ---------------------------------------------------------------- steps

/** nodes.<name>.emulate.speed of the emulated workers. */
function emulatedSpeeds(config: HetpsConfig): Record<string, number> {
  const emulated: Record<string, number> = {};
  for (const w of allWorkerNodes(config)) { const s = config.nodes[w.name]?.emulate?.speed; if (s !== undefined) emulated[w.name] = s; }
  return emulated;
}

/** The run dir, the logger and the opening lines. */
/** A run's context with what its summary reports of the config. */
type RunContext = JobContext & { emulated: Record<string, number>; notActive: string[] };

async function describeRun(o: JobRunOptions, out: JobPrinter): Promise<RunContext> {
  const { config } = o;
  const job = config.job.name;
  const level = o.level ?? process.env.HETPS_LOG_LEVEL ?? config.logging.level;
  const log = lineLogger(level, 'driver', (l) => out.line(l));
  const notActive = notActiveReport(config);
  if (notActive.length) {
    out.line('settings accepted but not active yet:');
    for (const l of notActive) out.line(`  - ${l}`);
  }
  const runId = `${new Date().toISOString().replace(/[:.]/g, '-')}-${randomUUID().slice(0, 6)}`;
  const runDir = resolve(config.job.run_dir, runId);
  await mkdir(runDir, { recursive: true });
  const workers = allWorkerNodes(config);
  const emulated = emulatedSpeeds(config);
  const groupsText = config.cluster.worker_groups.length > 0 ? `in ${config.cluster.worker_groups.length} group(s)`
    : groupsMeasuredAtStart(config) ? 'to be grouped by their measured profiles' : 'without groups';
  out.line(`hetps up: job ${job} (${config.training.mode}), ${config.cluster.server_nodes.length} server(s), ${workers.length} worker(s) ${groupsText}; run dir ${runDir}`);
  if (Object.keys(emulated).length) {
    out.line(`emulated heterogeneity: ${Object.entries(emulated).map(([n, s]) => `${n} at speed ${s}`).join(', ')} (each step takes ${config.training.emulation_reference_step_ms} ms / speed; not real hardware)`);
  }
  return {
    config, job, configPath: o.configPath, configArg: o.configArg, runId, runDir, level, log, out,
    md: modelAndData(config), ackWaitMs: ackWaitFromConfig(config.fault_tolerance), emulated, notActive,
    authDir: configuredAuthDir(config),
  };
}

/** The NATS servers of the run: nats.servers, a local cluster started here, or none (embedded). */
async function startCluster(ctx: JobContext, embeddedFlag: boolean, launch: boolean): Promise<{ servers: string[] | null; cluster: LocalCluster | null; embedded: boolean }> {
  const { config, out } = ctx;
  let servers = config.nats.servers;
  let cluster: LocalCluster | null = null;
  let embedded = embeddedFlag;
  if (embedded && servers) out.line('hetps up: --embedded given: ignoring nats.servers, running every node in this process');
  const tc = await checkTcLinks(ctx, { embedded, servers, launch });
  if (!embedded && !servers) {
    try {
      findNatsServer();
      // nats.secure: fresh credentials per role for this run's cluster, permissions for this job only.
      const auth = config.nats.secure ? await writeAuthFiles(ctx.runDir, ctx.job, { serverNodes: config.cluster.server_nodes }) : null;
      out.line(`starting a local 3-node NATS cluster (random ports${auth ? ', access control on' : ''})`);
      // Detached: a driver that is deposed (another took its lease over) leaves the cluster to the new scheduler;
      // every other end of this process stops it (runJob, the signal handlers, `stopClusterOnExit`).
      cluster = await startLocalCluster({
        nodes: 3, dir: join(ctx.runDir, 'nats'), clientPort: null, clusterPort: null, httpPort: null,
        maxPayload: config.nats.max_payload, jetstream: true, readyTimeoutMs: 60_000, detached: true,
        authorization: auth?.authorization ?? null,
        // Nodes on tc links reach the cluster from their namespaces, through their link's host address.
        ...(tc.length > 0 ? { listenHost: '0.0.0.0' } : {}),
      });
      servers = cluster.urls;
      out.line(`NATS cluster up: ${servers.join(',')}`);
      if (auth) {
        ctx.authDir = auth.dir;
        out.line(`access control: anonymous clients are refused; each process logs in as its role. Credentials in ${auth.dir}; `
          + `steer the job with: hetps ctl status --auth ${auth.roles.operator} --nats ${servers.join(',')} --job ${ctx.job}`);
      }
    } catch (e) {
      if (!(e instanceof MissingDependencyError)) throw e;
      if (tc.length > 0) throw new ConfigError(`${e.message}; nodes.${tc[0]!.node}.emulate.link: tc needs the NATS cluster hetps up starts (its node reaches it over its limited link)`, { cause: e, data: { field: `nodes.${tc[0]!.node}.emulate.link` } });
      out.line(`WARNING: ${e.message}`);
      out.line('WARNING: running the job embedded: every node in this one process on the in-process bus (no NATS)');
      embedded = true;
    }
  }
  if (embedded && config.nats.secure) out.line('nats.secure: nothing to secure embedded (one process, no NATS, nothing listens on the network but the dashboard)');
  return { servers: embedded ? null : servers, cluster, embedded };
}

/**
 * The nodes this run starts on tc-limited links (`nodes.<name>.emulate.link:
 * tc`), checked before anything starts: they need the local cluster `hetps
 * up` starts (a node in a network namespace reaches it through its link's
 * host address; a cluster given in nats.servers may not be reachable from
 * there, and embedded there is no link) and a machine that can make the
 * network lab (root, iproute2). With --no-launch the nodes are the user's
 * to start and to put behind their limits.
 */
async function checkTcLinks(ctx: JobContext, o: { embedded: boolean; servers: string[] | null; launch: boolean }): Promise<{ node: string; mbps: number }[]> {
  const tc = tcLinkedNodes(ctx.config);
  if (tc.length === 0) return tc;
  const field = `nodes.${tc[0]!.node}.emulate.link`;
  const which = tc.map((t) => t.node).join(', ');
  if (o.embedded) throw new ConfigError(`${field}: tc (${which}) limits a node's own network link, and embedded every node runs in this one process with no link: run with a NATS cluster (drop --embedded), or use link: hold`, { data: { field } });
  if (o.servers !== null) throw new ConfigError(`${field}: tc (${which}) needs the local NATS cluster hetps up starts (the node runs in a network namespace that reaches it over its limited link); with nats.servers, put the node behind a rate limit yourself, or use link: hold`, { data: { field } });
  if (!o.launch) {
    ctx.out.line(`--no-launch: ${which} have emulate.link tc; started by hand, they are on whatever link you give them (they hold no transfers themselves)`);
    return [];
  }
  const lab = await NetLab.available();
  if (!lab.ok) throw new ConfigError(`${field}: tc (${which}) needs a network lab on this machine (root, iproute2's ip and tc): ${lab.reason}; or use link: hold`, { data: { field } });
  return tc;
}

/**
 * cluster.start_barrier_seconds: waits for every worker's profile (each puts
 * one once its data and model are loaded and it measured itself) before the
 * job info — the workers' start signal — is put, at most that long. The plan
 * is written before it, so the servers take this run's plan meanwhile (a
 * server that the last run's plan does not name waits for this one).
 * Never fails the job: a worker missing then (not started, slow to start,
 * its process dead) trains from when it joins, and the line says so.
 */
async function startBarrier(ctx: JobContext, backend: JobBackend): Promise<void> {
  const { config, out } = ctx;
  const limitS = config.cluster.start_barrier_seconds;
  const names = allWorkerNodes(config).map((w) => w.name);
  if (limitS <= 0 || names.length === 0) return;
  const started = systemClock.monotonic();
  let said = -Infinity;
  try {
    await waitForProfiles(backend.profileStore, names, {
      clock: systemClock, timeoutMs: limitS * 1000, check: () => backend.check(),
      // Every 2 s at most: a large cluster joining says how far it got, not one line per worker.
      onProgress: (have, missing) => {
        if (missing.length === 0 || systemClock.monotonic() - said < 2_000) return;
        said = systemClock.monotonic();
        out.line(`start barrier: ${have}/${names.length} workers joined (waiting for ${missing.slice(0, 10).join(', ')}${missing.length > 10 ? ` and ${missing.length - 10} more` : ''}; at most ${limitS} s, cluster.start_barrier_seconds)`);
      },
    });
    out.line(`start barrier: all ${names.length} workers joined in ${((systemClock.monotonic() - started) / 1000).toFixed(1)} s; starting the job`);
  } catch (e) {
    const missing = e instanceof HetpsError ? e.data?.missing : undefined;
    out.line(`start barrier: ${Array.isArray(missing) ? `${missing.join(', ')} not joined after ${limitS} s` : (e as Error).message}; the job starts without waiting longer (a worker that joins later trains from then on)`);
  }
}

/** Starts the nodes and, where the groups come from measured profiles, waits for every worker's profile and plans the groups. */
async function startNodesAndPlanGroups(ctx: JobContext, backend: JobBackend, servers: readonly string[]): Promise<JobGrouping | null> {
  const { config, out } = ctx;
  await backend.startNodes();
  let grouping: JobGrouping | null = null;
  if (groupsMeasuredAtStart(config)) {
    // Every worker measures itself when it joins; the groups come from those profiles, before any worker trains.
    const names = allWorkerNodes(config).map((w) => w.name);
    const found = await setupStep({
      what: `waiting for the profiles of workers ${names.join(', ')}`, servers, check: `the node logs in ${join(ctx.runDir, 'logs')}`,
    }, () => waitForProfiles(backend.profileStore, names, {
      clock: systemClock, timeoutMs: DEFAULT_NODE_WAIT_MS, check: () => backend.check(),
      onProgress: (have, missing) => out.line(`waiting for profiles: ${have}/${names.length}${missing.length ? ` (missing: ${missing.join(', ')})` : ''}`),
    }));
    grouping = planJobGroups(config, profilesOf(found, names));
  } else if (config.training.mode === 'hps') {
    grouping = planJobGroups(config, []);
  }
  if (grouping !== null) {
    out.line(`worker groups (${grouping.criterion === 'config' ? `as written in ${config.source.file}` : `measured: k=${grouping.k} by ${grouping.criterion}`}`
      + `${grouping.score === null ? '' : `, silhouette ${grouping.score}`}; ${grouping.reason}): `
      + grouping.groups.map((g) => `${g.name} [${g.nodes.join(', ')}] ${g.sync_mode}${g.sync_steps !== null ? ` every ${g.sync_steps}` : ''}`).join('; '));
    const emulatedProfiles = grouping.profiles.filter((p) => p.emulated).map((p) => p.node);
    if (emulatedProfiles.length) out.line(`note: the profiles of ${emulatedProfiles.join(', ')} are EMULATED (compute scaled by emulate.speed), not real hardware`);
  }
  return grouping;
}

/**
 * --resume: every shard's state from the checkpoint, before a batch is
 * queued (the shards' primaries restore it and seed their backups again).
 * A plan with other shards (another cluster.server_nodes) or blocks cut
 * otherwise gets the checkpoint re-sharded onto it first
 * (actors/store/checkpoint-reshard.ts).
 */
async function restoreShards(ctx: JobContext, backend: JobBackend, plan: ShardPlan, resume: ResumePoint): Promise<void> {
  const { out, log } = ctx;
  await waitForShards(backend.system, plan, { timeoutMs: DEFAULT_NODE_WAIT_MS, log });
  const client = new ShardClient(backend.system, { requestTimeoutMs: 60_000, log, shouldStop: () => false, plans: plan });
  const from = `${resume.manifest.name}${resume.manifest.kind === 'delta' ? ` (a delta on ${resume.manifest.chain.join(' + ')})` : ''}`;
  // checkpoint.written_by shards: the storage is shared, so each shard reads its own files.
  const byShards = ctx.config.checkpoint.written_by === 'shards' ? (shard: string) => client.restoreFiles(shard, resume.path) : undefined;
  await restoreOntoPlan(resume, plan, (shard, snap) => client.restore(shard, snap as unknown as Record<string, unknown>), (e) => {
    if (e.kind === 'restored') out.line(`resume: shard ${e.shard} restored from ${from} (version ${e.version})${e.by === 'shard' ? ', read by the shard itself' : ''}`);
    // Another number of servers (or blocks cut otherwise): every row and block goes where this plan puts it.
    else out.line(`resume: re-sharded ${resume.manifest.name} from ${e.from.join(', ')} onto ${plan.shards.join(', ')}: `
      + `${e.dense_blocks} dense blocks, ${e.rows.reduce((n, r) => n + r.rows, 0)} rows (${e.rows.map((r) => `${r.shard} ${r.rows}`).join(', ')}): ${e.reason}`);
  }, byShards);
}

/** The shard plan, the queued batches and the job info (each store write a named set-up step in the NATS backend). */
async function createJob(ctx: JobContext, backend: JobBackend, grouping: JobGrouping | null, resumePoint: ResumePoint | null): Promise<PreparedJob> {
  const { config, out } = ctx;
  const resume = resumePoint;
  const prepared = await prepareJob({
    config, runId: ctx.runId, maxPayload: backend.transport.bus.maxPayload, md: ctx.md, planStore: backend.planStore, jobStore: backend.jobStore,
    queue: backend.queue, ackWaitMs: ctx.ackWaitMs, groups: grouping?.criterion === 'config' ? null : grouping?.groups ?? null,
    ...(resume === null ? {} : { beforeQueue: (plan: ShardPlan) => restoreShards(ctx, backend, plan, resume), done: resume.done, resumedFrom: resume.path }),
    // Measured groups waited for every profile already.
    ...(groupsMeasuredAtStart(config) ? {} : { beforeStart: () => startBarrier(ctx, backend) }),
  });
  const sh = prepared.sharding;
  out.line(sh.hotness
    ? `hotness sharding: ${sh.warmup_batches} warm-up batches; floats per batch by shard ${Object.entries(sh.expected_loads!).map(([k, v]) => `${k} ${v}`).join(', ')}: imbalance ${sh.expected_imbalance} (round-robin ${sh.round_robin_imbalance})`
    : `partitions dealt round-robin (${sh.skipped})`);
  out.line(`job created: plan v${prepared.plan.version} (${prepared.plan.dense.length} dense blocks, ${prepared.plan.partitions} sparse partitions over ${prepared.plan.shards.join(', ')}), `
    + `${prepared.descriptors.length} batches of ${config.data.batch_size} over ${config.data.epochs} epoch(s) queued`
    + (prepared.info.mode === 'bsp' ? `, ${prepared.info.rounds} bsp rounds` : ''));
  return prepared;
}

/** Sends each control command once `after_batches` batches are acknowledged, as a JSON NATS client; collects the replies. */
class ControlScript {
  readonly replies: ControlReply[] = [];
  private readonly sent = new Set<number>();
  private readonly pending: Promise<void>[] = [];
  constructor(private readonly ctx: JobContext, private readonly backend: JobBackend, private readonly commands: readonly ControlCommand[]) {}

  onProgress(batchesAcked: number): void {
    this.commands.forEach((c, i) => {
      if (this.sent.has(i) || batchesAcked < c.after_batches) return;
      this.sent.add(i);
      this.ctx.out.line(`--ctl-script: sending ${c.command} after ${batchesAcked} batches`);
      this.pending.push(this.send(c));
    });
  }

  private async send(c: ControlCommand): Promise<void> {
    let reply: unknown;
    try {
      const m = await this.backend.transport.request(controlSubject(this.ctx.job, c.command), new TextEncoder().encode(JSON.stringify(c.body)),
        { timeoutMs: 30_000, headers: { 'Content-Type': JSON_CONTENT_TYPE } });
      reply = JSON.parse(new TextDecoder().decode(m.data));
    } catch (e) {
      reply = { error: (e as Error).message };
    }
    this.ctx.out.line(`--ctl-script: ${c.command} reply ${JSON.stringify(reply)}`);
    this.replies.push({ after_batches: c.after_batches, command: c.command, reply });
  }

  async settled(): Promise<void> { await Promise.all(this.pending); }
}

interface Supervised { report: TrainingReport; cpu: CpuReport | null }

/** Training, from the first batch to the last acknowledged one: progress, periodic evaluation, control script, CPU window. */
async function supervise(
  ctx: JobContext, backend: JobBackend, monitor: TrainingMonitor, prepared: PreparedJob, emulated: Record<string, number>,
  evaluator: ShardEvaluator | null, evalEveryS: number, control: ControlScript, check: () => string | null,
): Promise<Supervised> {
  const { config, out } = ctx;
  let cpuStart: CpuSnapshot | null = null;
  let cpu: CpuReport | null = null;
  const report = await monitor.supervise({
    queue: backend.queue, prepared,
    onProgress: (p) => { out.progress(progressText(p, config.training.mode), p.total_batches > 0 ? p.batches_acked / p.total_batches : null); control.onProgress(p.batches_acked); },
    check,
    ...(evaluator ? { evaluation: { everyMs: evalEveryS * 1000, run: () => evaluator.evaluate() } } : {}),
    // Emulated nodes step at reference / speed: their busy time while their telemetry does not report one.
    nominalStepMs: (node) => (emulated[node] !== undefined ? config.training.emulation_reference_step_ms / emulated[node]! : null),
    onTrainingStart: () => { cpuStart = cpuSnapshot(backend.cpuProcesses()); },
    onTrainingEnd: () => { if (cpuStart) cpu = cpuBetween(cpuStart, cpuSnapshot(backend.cpuProcesses())); },
  });
  return { report, cpu };
}

function printTraining(out: JobPrinter, r: Supervised, regroups: readonly RegroupRecord[], emulated: Record<string, number>): void {
  const { report } = r;
  for (const g of regroups) {
    out.line(`regroup v${g.groups_version} at ${g.at_s.toFixed(1)} s (${g.reason}): ${g.groups.map((x) => `${x.name} [${x.nodes.join(', ')}] ${x.sync_mode}`).join('; ')}; paused ${g.pause_s.toFixed(1)} s`);
  }
  out.line(`training done: ${report.batches_acked}/${report.batches} batches acknowledged (${report.duplicate_acks} duplicate acks), `
    + `${report.samples} samples in ${report.train_s.toFixed(1)} s (${Math.round(report.samples_per_s)} samples/s)`);
  out.line(`batches per worker: ${Object.entries(report.per_worker).sort().map(([n, c]) => `${n} ${c}${emulated[n] !== undefined ? ` (emulated speed ${emulated[n]})` : ''}`).join(', ')}`);
  const util = report.utilisation;
  if (Object.values(util.per_node).some((n) => n.busy_from !== 'none')) {
    out.line(`utilisation (busy / ${util.wall_s.toFixed(1)} s of training): mean ${(util.mean * 100).toFixed(0)}%; `
      + Object.entries(util.per_node).map(([n, u]) => `${n} ${(u.utilisation * 100).toFixed(0)}%`).join(', '));
  }
  const c = r.cpu;
  if (c) {
    out.line(`CPU while training: the job's processes used ${c.process_cpu_s.toFixed(1)} CPU-s in ${c.window_s.toFixed(1)} s on ${c.cores} cores `
      + `(${(c.cpu_busy_fraction * 100).toFixed(0)}% of the machine${c.machine_busy_fraction === null ? '' : `; whole machine ${(c.machine_busy_fraction * 100).toFixed(0)}% busy`})`);
  }
}

/** The trained parameters on the test split, the shards' staleness, and the workers' last words. */
async function evaluate(ctx: JobContext, shardClient: ShardClient, monitor: TrainingMonitor, prepared: PreparedJob): Promise<{ evaluation: Evaluation; staleness: StalenessSummary }> {
  const { config, md, out, log } = ctx;
  out.line('evaluating the shards\' parameters on the test split');
  const evaluation = await evaluateOnShards({
    client: shardClient,
    plan: prepared.plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), source: md.source,
    batchSize: Math.max(config.data.batch_size, EVAL_BATCH_MIN), threads: null,
  });
  const staleness = await shardStalenessSummary(shardClient, prepared.plan.shards, log);
  if (staleness.count > 0) {
    out.line(`push staleness (updates behind the shard): mean ${staleness.mean.toFixed(2)}, max ${staleness.max}`
      + (staleness.max_staleness === null ? ' (measured only)' : `; ${staleness.scaled} applied at lr/(1+s), ${staleness.refused} refused beyond max_staleness ${describeMaxStaleness(staleness.max_staleness, staleness.sparse_max_staleness)}`
        + (staleness.dense_dropped + staleness.sparse_dropped === 0 ? '' : `, ${staleness.dense_dropped} applied without their dense part and ${staleness.sparse_dropped} without their rows (beyond that kind's bound)`)));
  }
  // A worker script may still be saving a checkpoint from the shards: let every live worker finish first.
  const gone = await monitor.waitForWorkers({ timeoutMs: 30_000, silenceMs: 5_000 });
  if (gone.length) out.line(`workers that never reported the end of their loop (gone?): ${gone.join(', ')}`);
  return { evaluation, staleness };
}

/** Ctrl-C / SIGTERM: end the nodes and the cluster, release the lease, then exit. Returns the uninstaller. */
function onSignals(ctx: JobContext, backend: JobBackend, cluster: LocalCluster | null): () => void {
  let interrupted = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (interrupted) return;
    interrupted = true;
    ctx.out.end();
    ctx.out.line(`hetps up: got ${sig}; stopping every node${cluster ? ' and the NATS cluster' : ''}`);
    void (async () => {
      await backend.kill().catch(() => undefined);
      await backend.lease?.release(`interrupted (${sig})`).catch(() => undefined);
      await cluster?.stop().catch(() => undefined);
      process.exit(sig === 'SIGINT' ? 130 : 143);
    })();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  return () => {
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  };
}

/**
 * The local cluster is started detached (it must outlive a deposed driver):
 * any other exit of this process, an uncaught error included, still takes
 * it down, as a cluster tied to this process would be. Returns `leave`,
 * which keeps it running past the exit.
 */
function stopClusterOnExit(cluster: LocalCluster | null): { leave(): void; remove(): void } {
  if (cluster === null) return { leave: () => undefined, remove: () => undefined };
  const kill = () => { for (const n of cluster.nodes) { try { process.kill(n.pid, 'SIGKILL'); } catch { /* gone */ } } };
  process.on('exit', kill);
  const remove = () => { process.removeListener('exit', kill); };
  return { leave: remove, remove };
}

async function writeSummary(summary: UpSummary, runDir: string, also: string | null): Promise<void> {
  const text = `${JSON.stringify(summary, null, 2)}\n`;
  await writeFile(join(runDir, 'summary.json'), text);
  if (also) await writeFile(resolve(also), text);
}

/** The driver's login: the scheduler role's in secure mode. */
function natsAuthOf(ctx: JobContext): { auth: NatsAuth | null; tls: NatsTls | null } {
  const c = natsConnectionAs(ctx.config, 'scheduler', ctx.authDir);
  return { auth: c.auth, tls: c.tls };
}

// ---------------------------------------------------------------- the job, created: to its end

/** What supervising a created job to its end produced. */
interface Conducted {
  trained: Supervised;
  evaluated: { evaluation: Evaluation; staleness: StalenessSummary };
  integrity: IntegrityReport | null;
  failover: ShardFailover | null;
  balancer: LoadBalancer | null;
  regroups: RegroupRecord[];
  shardClient: ShardClient;
  checkpoints: CheckpointTaken[];
  sharding: ShardingReport;
}

/**
 * From a created job to its end, the same for the driver that created it
 * and for a standby that took it over: shard failover, the periodic
 * evaluation, pause / regroup, the scheduler attached to the job, training
 * supervised to the last acknowledgement, the final evaluation and the
 * integrity check.
 */
async function conductJob(ctx: RunContext, backend: JobBackend, plane: ControlPlane, prepared: PreparedJob, o: {
  nats: boolean; evalEveryS: number; evalSamples: number; control: ControlScript; check: () => string | null; profiles: readonly NodeProfile[];
  /** The job info says a ctl.pause is in force (a standby taking over a paused job): the new controller holds the pause. */
  pausedAtStart: boolean;
}): Promise<Conducted> {
  const { config, job, md, log, out } = ctx;
  const monitor = plane.monitor.training;
  const shardClient = new ShardClient(backend.system, { requestTimeoutMs: 30_000, log, shouldStop: () => false, plans: PlanView.follow(prepared.plan, backend.planStore) });
  let failover: ShardFailover | null = null;
  let failoverActor: Actor<never> | null = null;
  let balancer: LoadBalancer | null = null;
  let periodic: ShardEvaluator | null = null;
  let regrouper: RegroupController | null = null;
  let stopCheckpoints = () => {};
  let cutMoment: CutMoment | null = null;
  try {
    if (o.nats) {
      // Failover acts on the health actor's verdicts; the embedded mode has one process, nothing to fail over to.
      failover = new ShardFailover({
        planStore: backend.planStore, health: plane.health, servers: config.cluster.server_nodes, backupFactor: config.fault_tolerance.backup_factor,
        transport: backend.transport, job, clock: systemClock, log,
        appliedOf: async (shard, node) => {
          const s = await backend.system.ref('shard', replicaId(shard, node)).request<{ applied_rseq?: number | null }>('stats', {}, { timeoutMs: 500 });
          return typeof s.applied_rseq === 'number' ? s.applied_rseq : null;
        },
      });
      failoverActor = await backend.system.spawn(createFailoverActor(failover)) as unknown as Actor<never>;
    }
    if (o.evalEveryS > 0) {
      // One thread: the evaluation shares the machine with the nodes it measures.
      periodic = await ShardEvaluator.create({
        client: shardClient, plan: prepared.plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), source: md.source,
        batchSize: Math.max(config.data.batch_size, EVAL_BATCH_MIN), threads: 1, maxSamples: o.evalSamples,
      });
    }
    const info = prepared.info;
    // Every mode can be paused; regrouping (and its automatic trigger) is hps only.
    regrouper = new RegroupController({
      transport: backend.transport, job, jobStore: backend.jobStore, clock: systemClock, log, profileStore: backend.profileStore,
      // A pause in force is entered again from the version before it: the same job info is written, and this controller owns the pause.
      info: o.pausedAtStart ? { ...info, groups_version: info.groups_version - 1, paused: false } : info,
      profiles: o.profiles,
      isDead: (node) => plane.health.stateOf(node) === 'dead',
      // A group member dropped as dead that is alive again (a healed link) is taken back into its group.
      health: plane.health,
      onPaused: (v, workers) => {
        out.line(`paused: every live worker stopped at its boundary (${workers.join(', ')}); send ctl.resume to continue`);
        publishEvent(backend.transport, job, 'scheduler', { kind: 'paused', node: null, text: `every live worker paused (groups v${v})` });
      },
    });
    if (o.pausedAtStart) await regrouper.pause('paused before this scheduler took over');
    const controller = regrouper;
    plane.monitor.setTotalBatches(info.total_batches);
    const ck = config.checkpoint;
    cutMoment = new CutMoment({ transport: backend.transport, job, clock: systemClock });
    const moment = cutMoment;
    const checkpointer = new Checkpointer({
      moment: (capMs) => moment.wait(capMs),
      root: checkpointRoot(config), keep: ck.keep, fullEvery: ck.full_every, job, model: checkpointModelOf(config, md.model), controller, plan: () => shardClient.plans.current,
      clock: systemClock, log,
      frozen: {
        freeze: (shard, token) => shardClient.freeze(shard, token), take: (shard, token) => shardClient.takeFrozen(shard, token),
        ...(ck.written_by === 'shards' ? { write: (shard: string, token: string, dir: string, chain: { name?: string; base: string | null }) => shardClient.writeFrozen(shard, token, dir, chain) } : {}),
      },
      acked: () => [...(prepared.done ?? []), ...monitor.ackedBatches()], totalBatches: prepared.descriptors.length + (prepared.done?.size ?? 0),
    });
    if (failover !== null && config.load_balancing.enabled) {
      // Moves a primary off a server whose load stayed load_balancing.imbalance_threshold above the idlest one's for sustain_seconds.
      const lb = config.load_balancing;
      const inactive = balancerIdleReason(config);
      balancer = new LoadBalancer({
        failover, planStore: backend.planStore, system: backend.system, health: plane.health, servers: config.cluster.server_nodes,
        threshold: lb.imbalance_threshold, sustainS: lb.sustain_seconds, capacity: serverCapacities(config), capacityFrom: lb.capacity, exclusive: (fn) => checkpointer.exclusive(fn),
        transport: backend.transport, job, clock: systemClock, log,
      }, inactive);
      balancer.start();
    }
    plane.scheduler.attach({ info: () => controller.jobInfo, plan: () => shardClient.plans.current, controller, checkpointer, ...(balancer ? { balancer } : {}), sharding: prepared.sharding });
    // checkpoint.every_s: one after each interval of training, counted from the first acknowledged batch, then
    // from the end of the last checkpoint. Before any batch is trained the shards may still be starting, and
    // there is nothing to save: a cut then would only pause the workers for a checkpoint that fails.
    let periodicTimer: NodeJS.Timeout | null = null;
    const schedule = () => {
      if (ck.every_s <= 0) return;
      if (monitor.ackedBatches().size === 0) {
        periodicTimer = setTimeout(schedule, 250);
        return;
      }
      periodicTimer = setTimeout(() => {
        void checkpointer.take('periodic')
          .catch((e: unknown) => { log.warn({ err: (e as Error).message }, `periodic checkpoint failed: ${(e as Error).message}; the next one is tried in ${ck.every_s} s`); })
          .finally(schedule);
      }, ck.every_s * 1000);
    };
    schedule();
    const stopPeriodic = () => { if (periodicTimer !== null) clearTimeout(periodicTimer); periodicTimer = null; };
    stopCheckpoints = stopPeriodic;
    // A shard with no live replica for server_recovery_timeout ends the job with the reason (it would wait forever).
    const serverRecoveryMs = config.fault_tolerance.server_recovery_timeout * 1000;
    const check = () => failover?.overdue(serverRecoveryMs) ?? o.check();
    const trained = await supervise(ctx, backend, monitor, prepared, ctx.emulated, periodic, o.evalEveryS, o.control, check);
    stopPeriodic();
    await balancer?.dispose();
    for (const m of balancer?.migrations ?? []) {
      out.line(`load balancing: shard ${m.shard}'s primary moved ${m.from} → ${m.to} (plan v${m.epoch}; imbalance ${m.imbalance}`
        + `${m.measured_after ? `, ${m.measured_after.imbalance} measured after` : ''})`);
    }
    if (ck.at_end) {
      // The state the job ends with, resumable and exportable; a failure is reported, not fatal (training is done).
      await checkpointer.take('end').then(
        (r) => out.line(`checkpoint ${r.path}: ${r.files} files, ${(r.bytes / 2 ** 20).toFixed(2)} MiB (checkpoint.at_end)`),
        (e: unknown) => { log.warn({ err: (e as Error).message }, `the end-of-job checkpoint failed: ${(e as Error).message}`); },
      );
    }
    plane.scheduler.setEnded('stopping');
    await o.control.settled();
    await regrouper.dispose();
    out.end();
    printTraining(out, trained, regrouper.records, ctx.emulated);
    const evaluated = await evaluate(ctx, shardClient, monitor, prepared);
    await failover?.settled();
    const finalPlan = await shardClient.plans.refresh();
    // The queue is the ground truth: once it is empty every batch was acknowledged, including any whose
    // worker died between its acknowledgement and its report; the shards' logs then say whether each was applied.
    // Read a few times: one JetStream answer lost on a busy cluster must not make the check fall back to telemetry (at most once).
    let pending = -1;
    for (let k = 0; k < 5 && pending < 0; k++) {
      pending = await backend.queue.pending().catch(() => -1);
      if (pending < 0) await new Promise((r) => setTimeout(r, 500));
    }
    const queueEmpty = pending === 0;
    if (pending < 0) log.warn('the batch queue did not answer; the integrity check counts the acknowledgements heard as telemetry');
    const acked = queueEmpty ? new Set(prepared.descriptors.map((d) => d.batch_id)) : monitor.ackedBatches();
    const unreported = acked.size - monitor.ackedBatches().size;
    if (unreported > 0) out.line(`${unreported} batch(es) were acknowledged without a report (their worker died between the two); the integrity check counts them`);
    const integrity = await checkIntegrity({ system: backend.system, plan: finalPlan, acked, clock: systemClock, log });
    out.line(`integrity: ${integrity.acked} batches acknowledged, ${integrity.applied} applied on every shard, ${integrity.lost} lost, ${integrity.duplicated} applied twice`
      + `${integrity.dropped_stale ? `, ${integrity.dropped_stale} dropped as too stale` : ''}; replicas ${integrity.replicas_equal === null ? 'not all checked' : integrity.replicas_equal ? 'equal' : 'DIFFER'}`
      + ` (plan v${finalPlan.version}${failover && failover.failovers.length ? `, ${failover.failovers.length} failover(s)` : ''})`);
    if (integrity.lost || integrity.duplicated) log.warn({ lost: integrity.lost_examples, duplicated: integrity.duplicated_examples }, 'integrity check found lost or duplicated batches');
    return { trained, evaluated, integrity, failover, balancer, regroups: regrouper.records, shardClient, checkpoints: checkpointer.taken, sharding: prepared.sharding };
  } finally {
    stopCheckpoints();
    await balancer?.dispose().catch(() => undefined);
    cutMoment?.dispose();
    failover?.dispose();
    if (failoverActor) await backend.system.despawn(failoverActor).catch(() => undefined);
    await regrouper?.dispose().catch(() => undefined);
    await periodic?.dispose().catch(() => undefined);
  }
}

/** The run summary (also what `hetps up --json` prints). */
function summaryOf(ctx: RunContext, c: Conducted, o: {
  t0: number; embedded: boolean; servers: string[] | null; evalEveryS: number; evalSamples: number;
  controlReplies: ControlReply[] | null; grouping: JobGrouping | null; scheduler: SchedulerReport;
  resumedFrom?: { checkpoint: string; batches_done: number } | null;
}): UpSummary {
  const { config, md } = ctx;
  const { report, cpu } = c.trained;
  const { evaluation, staleness } = c.evaluated;
  const failover = c.failover;
  return {
    mode: config.training.mode,
    samples: report.samples,
    samples_per_s: report.samples_per_s,
    test_auc: evaluation.kind === 'ctr' ? evaluation.auc : null,
    test_logloss: evaluation.logloss,
    ...(evaluation.kind === 'mlp' ? { test_accuracy: evaluation.accuracy } : {}),
    final_train_loss: report.final_loss,
    wall_s: (performance.now() - o.t0) / 1000,
    transport: o.embedded ? 'embedded' : 'nats',
    // A resumed job's batches include those done before its checkpoint (resumed_from.batches_done).
    batches: report.batches + (o.resumedFrom?.batches_done ?? 0),
    batches_acked: report.batches_acked,
    ...(o.resumedFrom ? { resumed_from: o.resumedFrom } : {}),
    duplicate_acks: report.duplicate_acks,
    job: ctx.job, run_id: ctx.runId, run_dir: ctx.runDir,
    train_s: report.train_s,
    unconfirmed_acks: report.unconfirmed_acks,
    redelivered: report.redelivered,
    per_worker: report.per_worker,
    emulated: ctx.emulated,
    nats: o.servers,
    not_active: ctx.notActive,
    eval_every_s: o.evalEveryS > 0 ? o.evalEveryS : null,
    eval_samples: o.evalEveryS > 0 ? Math.min(o.evalSamples, md.source.describe().testSize) : null,
    curve: report.curve,
    first_step_s: report.first_step_s,
    utilisation: report.utilisation,
    cpu,
    staleness,
    regroups: c.regroups,
    checkpoints: c.checkpoints,
    per_worker_group: report.per_worker_group,
    ...(o.controlReplies !== null ? { control_replies: o.controlReplies } : {}),
    grouping: o.grouping,
    integrity: c.integrity,
    replication: {
      backup_factor: config.fault_tolerance.backup_factor,
      mode: config.fault_tolerance.replication,
      failovers: failover?.failovers ?? [],
      replicas_added: failover?.replicas ?? [],
      shards_lost: failover ? [...failover.lost] : [],
      unprotected: failover?.report().unprotected ?? [],
      client_reroutes: c.shardClient.rerouted,
    },
    load_balancing: c.balancer?.report() ?? null,
    sharding: c.sharding,
    scheduler: o.scheduler,
  };
}

/** Where the monitor serves the dashboard and `/metrics` (monitoring.enabled, monitoring.port; 0: off). */
/** The file a run's generated dashboard token is written to (monitoring.auth: token without monitoring.token_file). */
export const DASHBOARD_TOKEN_FILE = 'dashboard-token';

/**
 * Where the dashboard listens, and its token (monitoring.auth: token): the
 * first line of monitoring.token_file, or a new one written to
 * <run dir>/dashboard-token (readable by its owner only). Null when the
 * dashboard is off. Says so when it listens beyond this machine with no token.
 */
async function dashboardHttp(config: HetpsConfig, runDir: string, out: JobPrinter): Promise<{ port: number; host: string; token: string | null } | null> {
  const m = config.monitoring;
  if (!m.enabled || m.port <= 0) return null;
  let token: string | null = null;
  if (m.auth === 'token') {
    if (m.token_file !== null) {
      const file = resolve(m.token_file);
      const text = await readFile(file, 'utf8').catch((e: unknown) => {
        throw new ConfigError(`monitoring.token_file: cannot read ${file} (${(e as Error).message}); give a file whose first line is the dashboard's token, or leave it out for a new token each run`, { data: { field: 'monitoring.token_file' } });
      });
      token = text.split('\n')[0]!.trim();
      if (token.length < 16) throw new ConfigError(`monitoring.token_file: the first line of ${file} is ${token.length === 0 ? 'empty' : `${token.length} characters`}; a token needs at least 16`, { data: { field: 'monitoring.token_file' } });
    } else {
      token = newDashboardToken();
      await mkdir(runDir, { recursive: true });
      await writeFile(join(runDir, DASHBOARD_TOKEN_FILE), `${token}\n`, { mode: 0o600 });
    }
  } else if (!isLoopback(m.host)) {
    out.line(`warning: the dashboard listens on ${m.host}:${m.port} with no token, and its buttons steer the job: anyone who reaches it can pause or regroup it; set monitoring.auth: token`);
  }
  return { port: m.port, host: m.host, token };
}

const isLoopback = (host: string) => host === 'localhost' || host === '::1' || host.startsWith('127.');

/** The start-up line naming the dashboard (the URL to open) and /metrics, with where its token is when it asks for one. */
function dashboardLine(url: string, login: string, runDir: string, config: HetpsConfig): string {
  if (login === url) return `dashboard: ${url}  (metrics: ${url}metrics)`;
  const where = config.monitoring.token_file !== null ? resolve(config.monitoring.token_file) : join(runDir, DASHBOARD_TOKEN_FILE);
  return `dashboard: ${login}  (metrics: ${url}metrics with Authorization: Bearer <the token in ${where}>)`;
}

/** What the lease says of this driver for `check`: a deposed scheduler must stop supervising. */
function leaseCheck(lease: LeaseHolder | null): string | null {
  return lease?.lost ? lease.lost.message : null;
}

/**
 * The end of a run for whoever holds the lease: the nodes told to stop, the
 * lease released (a standby then knows the job is over), the connection and
 * the cluster closed. A deposed driver does none of the first two: the job
 * and its nodes belong to the scheduler that took over.
 */
async function endRun(ctx: JobContext, backend: JobBackend, o: { cluster: LocalCluster | null; failure: unknown; exitHook: { leave(): void; remove(): void } }): Promise<void> {
  const { log, out } = ctx;
  const lease = backend.lease ?? null;
  out.end();
  if (lease?.lost) {
    out.line(`hetps up: ${lease.lost.message}; leaving the nodes${o.cluster ? ' and the NATS cluster' : ''} to the scheduler that took over`);
    await backend.close().catch(() => undefined);
    o.exitHook.leave();
    return;
  }
  // The run is over: a node started for the job's next run must not join this one.
  await markEnded(backend, ctx.runId).catch((e: unknown) => log.debug({ err: (e as Error).message }, 'could not mark the run as ended in the job info'));
  await backend.stopNodes().catch((e: unknown) => log.warn({ err: (e as Error).message }, 'stopping the nodes failed'));
  await lease?.release(o.failure === null ? 'the job is done' : `the job failed: ${(o.failure as Error).message ?? String(o.failure)}`).catch(() => undefined);
  await backend.close().catch(() => undefined);
  await o.cluster?.stop().catch(() => undefined);
  o.exitHook.remove();
}

// ---------------------------------------------------------------- the run

/** Runs the job to its end and returns the summary (also written to `<run dir>/summary.json`). */
export async function runJob(o: JobRunOptions, out: JobPrinter): Promise<UpSummary> {
  const t0 = performance.now();
  const ctx = await describeRun(o, out);
  const { config, log } = ctx;

  const { servers, cluster, embedded } = await startCluster(ctx, o.embedded, o.launch);
  const standbys = ctx.config.fault_tolerance.standby_workers;
  if (standbys.length > 0) {
    ctx.out.line(servers === null
      ? `standby workers ${standbys.join(', ')}: not started (embedded: every node runs in this one process, so no member dies alone)`
      : `standby workers ${standbys.join(', ')}: warm, training nothing until a group member is dead; then one takes its place`);
  }
  const exitHook = stopClusterOnExit(cluster);
  let backend: JobBackend;
  try {
    backend = servers === null
      ? await embeddedBackend(ctx)
      : await natsBackend(ctx, { servers, cluster, launch: o.launch, skip: o.skip });
  } catch (e) {
    await cluster?.stop().catch(() => undefined);
    exitHook.remove();
    throw e;
  }
  const lease = backend.lease ?? null;
  const removeSignalHandlers = onSignals(ctx, backend, cluster);

  let shutdownRequested: string | null = null;
  const check = () => leaseCheck(lease) ?? (shutdownRequested !== null ? `ctl.shutdown: ${shutdownRequested}` : backend.check());
  const control = new ControlScript(ctx, backend, o.ctlScript ?? []);
  let plane: ControlPlane | null = null;
  let grouping: JobGrouping | null = null;
  let conducted: Conducted;
  let failure: unknown = null;
  try {
    // The control plane first: it hears every node from its first heartbeat and report.
    plane = await startControlPlane(backend.system, {
      policy: { heartbeatMs: config.fault_tolerance.heartbeat_ms, deadAfterMs: config.fault_tolerance.dead_after_ms }, log,
      onShutdown: (reason) => { shutdownRequested = reason; },
      nats: servers === null ? null : { servers, ...natsAuthOf(ctx) }, secure: servers !== null && config.nats.secure,
      http: await dashboardHttp(config, ctx.runDir, ctx.out), onServing: (url, login) => ctx.out.line(dashboardLine(url, login, ctx.runDir, config)),
      telemetryLog: join(ctx.runDir, TELEMETRY_LOG), compression: gradientCompressionFromConfig(config),
    });
    const p = plane;
    backend.onNodeExit((node, how) => p.nodeExited(node, how));
    grouping = await startNodesAndPlanGroups(ctx, backend, servers ?? []);
    const prepared = await createJob(ctx, backend, grouping, o.resume ?? null);
    conducted = await conductJob(ctx, backend, plane, prepared, {
      nats: servers !== null, evalEveryS: o.evalEveryS, evalSamples: o.evalSamples, control, check, profiles: grouping?.profiles ?? [], pausedAtStart: false,
    });
  } catch (e) {
    failure = e;
    throw lease?.lost ?? e;
  } finally {
    await plane?.stop();
    await endRun(ctx, backend, { cluster, failure, exitHook });
    removeSignalHandlers();
  }
  // Deposed after training (during the evaluation): the summary is the new scheduler's to write.
  if (lease?.lost) throw lease.lost;

  const summary = summaryOf(ctx, conducted, {
    t0, embedded, servers, evalEveryS: o.evalEveryS, evalSamples: o.evalSamples, controlReplies: o.ctlScript !== null ? control.replies : null, grouping,
    scheduler: { lease_ms: lease?.leaseMs ?? null, holder: lease?.holder ?? null, takeovers: lease?.takeovers ?? [], acks_seen_from: 'job_start' },
    resumedFrom: o.resume ? { checkpoint: o.resume.path, batches_done: o.resume.done.size } : null,
  });
  await writeSummary(summary, ctx.runDir, o.summaryPath);
  return summary;
}

// ---------------------------------------------------------------- the standby

/** The groups of a job taken over, for the summary: the YAML's as written, or the measured ones as the job info has them. */
function groupingAtTakeover(config: HetpsConfig, info: JobInfo): JobGrouping | null {
  if (config.training.mode !== 'hps') return null;
  if (!groupsMeasuredAtStart(config)) return planJobGroups(config, []);
  const groups = info.groups ?? [];
  return {
    k: groups.length, criterion: config.cluster.grouping.k == null ? 'silhouette' : 'fixed', score: null, candidates: [], profiles: [],
    reason: 'measured by the driver that started the job; taken over as the job info has them (its scores and profiles are not recorded there)',
    groups: groups.map((g) => ({ ...g, nodes: [...g.nodes], centroid: null })),
  };
}

/**
 * `hetps up --standby`: waits on the job's scheduler lease and, once the
 * active driver stops renewing it, takes the job over and runs it to its
 * end (see the module comment). Returns the summary, or null when the job
 * ended under its active driver (or the wait was interrupted) with nothing
 * to take over.
 */
export async function runStandby(o: StandbyRunOptions, out: JobPrinter): Promise<UpSummary | null> {
  const t0 = performance.now();
  const { config } = o;
  const job = config.job.name;
  const servers = config.nats.servers;
  if (servers === null || servers.length === 0) {
    throw new ConfigError(`hetps up --standby needs the NATS cluster the job runs on: give --nats URL[,URL…] or nats.servers in ${config.source.file} `
      + '(the active `hetps up` prints the URLs of the cluster it starts: "NATS cluster up: …")', { data: { field: 'nats.servers' } });
  }
  const level = o.level ?? process.env.HETPS_LOG_LEVEL ?? config.logging.level;
  const log = lineLogger(level, 'driver', (l) => out.line(l));
  const notActive = notActiveReport(config);
  out.line(`hetps up --standby: job ${job} on ${servers.join(',')}: standing by on the scheduler lease (KV bucket ${leaseBucketName(job)})`);
  // Loaded now, so a takeover does not wait for it.
  const md = modelAndData(config);
  const driver = await connectDriver({ config, job, log, servers, natsDir: null, name: 'hetps-standby', authDir: null });
  // Counting from now: the monitor listens as it is made (its mailbox only comes with a takeover).
  const monitorDef = createMonitorActor({ transport: driver.transport, job, clock: systemClock, log });
  await driver.transport.flush();
  out.line('listening to the job\'s telemetry: acknowledgements are counted from now');
  const jobStore = natsJobInfoStore(driver.nc, job);
  const infoAtStart = await jobStore.get();
  if (infoAtStart !== null) {
    out.line(`note: run ${infoAtStart.run_id} of job ${job} was created before this standby started: if it is the one taken over, `
      + 'the acknowledgements before now are not in this standby\'s count');
  }
  const standby = new LeaseStandby({
    kv: driver.leaseKv, clock: systemClock, identity: { holder: driver.holder, incarnation: driver.system.senderId }, log,
    onHolder: (r) => out.line(`scheduler lease held by ${r.holder} (run ${r.run_id ?? 'not created yet'}, term ${r.term}); standing by`),
  });
  const onSignal = () => standby.stop();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const outcome = await standby.wait().finally(() => {
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  });
  if (outcome.kind !== 'took_over') {
    out.line(outcome.kind === 'ended'
      ? `job ${job} ended under ${outcome.record.holder} (${outcome.record.reason ?? 'released'}): nothing to take over`
      : 'hetps up --standby: interrupted while standing by');
    monitorDef.training.dispose();
    await driver.close();
    return null;
  }
  const lease = outcome.holder;
  const { takeover } = outcome;
  out.line(`took over job ${job} from ${takeover.from}: its lease went unrenewed for ${takeover.lease_gap_ms} ms (term ${takeover.term})`);

  let backend: JobBackend | null = null;
  let plane: ControlPlane | null = null;
  let ctx!: RunContext;
  let conducted: Conducted;
  let failure: unknown = null;
  let removeSignalHandlers: () => void = () => undefined;
  let info: JobInfo;
  try {
    // What the job is: its info (the run the lease names), its plan, its batches.
    const runId = outcome.previous.run_id;
    info = await waitForJobInfo(jobStore, { clock: systemClock, timeoutMs: 10_000, runId }).catch((e: unknown) => {
      throw new HetpsError(`${takeover.from} died before it created run ${runId ?? '?'} of job ${job} (no job info: ${(e as Error).message}); `
        + 'a standby takes over a job, it does not create one: run hetps up again', { cause: e });
    });
    const plan = await natsPlanStore(driver.nc, job).get();
    if (plan === null) throw new HetpsError(`run ${info.run_id} of job ${job} has job info but no shard plan: cannot take it over`);
    // A resumed run: the batches done before its checkpoint are not the run's (the checkpoint's manifest says which).
    const done = info.resumed_from ? await doneBefore(info.resumed_from, info.run_id) : new Set<string>();
    if (info.resumed_from) out.line(`run ${info.run_id} resumed from ${info.resumed_from.checkpoint}: its ${done.size} batches done before it are not this run's`);
    const descriptors = batchDescriptors(config, md.source).filter((d) => !done.has(d.batch_id));
    if (descriptors.length !== info.total_batches) {
      throw new ConfigError(`${o.configArg} gives ${descriptors.length} batches, but run ${info.run_id} has ${info.total_batches}: `
        + 'the standby needs the config the job\'s driver was started with', { data: { field: 'data' } });
    }
    const runDir = resolve(config.job.run_dir, info.run_id);
    await mkdir(runDir, { recursive: true });
    ctx = {
      config, job, configPath: o.configPath, configArg: o.configArg, runId: info.run_id, runDir, level, log, out, md,
      ackWaitMs: info.ack_wait_ms, emulated: emulatedSpeeds(config), notActive,
      authDir: configuredAuthDir(config),
    };
    backend = natsStandbyBackend(driver, { job, runId: info.run_id, lease });
    removeSignalHandlers = onSignals(ctx, backend, null);
    // The control plane of the job from now on; the monitor is the one that has been counting.
    let shutdownRequested: string | null = null;
    plane = await startControlPlane(driver.system, {
      policy: { heartbeatMs: config.fault_tolerance.heartbeat_ms, deadAfterMs: config.fault_tolerance.dead_after_ms }, log,
      onShutdown: (reason) => { shutdownRequested = reason; },
      nats: { servers, ...natsAuthOf(ctx) }, monitor: monitorDef, secure: config.nats.secure,
      http: await dashboardHttp(config, runDir, out), onServing: (url, login) => out.line(dashboardLine(url, login, runDir, config)),
      telemetryLog: join(runDir, TELEMETRY_LOG), compression: gradientCompressionFromConfig(config),
    });
    const pending = await backend.queue.pending().catch(() => null);
    out.line(`run ${info.run_id} (${info.mode}): ${pending ?? '?'} of ${info.total_batches} batches not acknowledged yet; `
      + `${monitorDef.training.ackedBatches().size} acknowledgements seen by this standby; plan v${plan.version}`);
    if (info.resume_version < info.groups_version && !info.paused) {
      // A regroup the old scheduler left half done: the workers that paused for it wait for its resume.
      info = { ...info, resume_version: info.groups_version };
      await backend.jobStore.put(info);
      out.line(`regroup v${info.groups_version} was in progress: resumed (the workers pausing for it go on in the new groups)`);
    }
    const paused = info.paused && info.resume_version < info.groups_version;
    if (paused) out.line(`the job is paused (groups v${info.groups_version}): it stays paused until ctl.resume`);
    const check = () => leaseCheck(lease) ?? (shutdownRequested !== null ? `ctl.shutdown: ${shutdownRequested}` : null);
    // The warm-up reads the same batches the creating driver read: the report of the plan it wrote.
    const sharding = shardingReport(config, md.model, driver.transport.bus.maxPayload, plan, partitionHotness(config, md));
    conducted = await conductJob(ctx, backend, plane, { plan, sharding, descriptors, info }, {
      nats: true, evalEveryS: o.evalEveryS, evalSamples: o.evalSamples, control: new ControlScript(ctx, backend, []), check, profiles: [], pausedAtStart: paused,
    });
  } catch (e) {
    failure = e;
    throw lease.lost ?? e;
  } finally {
    await plane?.stop();
    if (backend !== null) {
      await endRun(ctx, backend, { cluster: null, failure, exitHook: stopClusterOnExit(null) });
    } else {
      // Nothing of the job was read: the lease goes back, so whoever starts the job again is not kept waiting.
      await lease.release(`the standby could not take the job over: ${(failure as Error | null)?.message ?? 'unknown'}`).catch(() => undefined);
      monitorDef.training.dispose();
      await driver.close();
    }
    removeSignalHandlers();
  }
  if (lease.lost) throw lease.lost;

  const summary = summaryOf(ctx, conducted, {
    t0, embedded: false, servers, evalEveryS: o.evalEveryS, evalSamples: o.evalSamples, controlReplies: null,
    grouping: groupingAtTakeover(config, info), resumedFrom: info.resumed_from ?? null,
    scheduler: {
      lease_ms: lease.leaseMs, holder: lease.holder, takeovers: lease.takeovers,
      acks_seen_from: infoAtStart !== null && infoAtStart.run_id === info.run_id ? 'standby_start' : 'job_start',
    },
  });
  await writeSummary(summary, ctx.runDir, o.summaryPath);
  return summary;
}

/** The batches done before the checkpoint a run resumed from, as its manifest records them; refused by name when it cannot be read. */
async function doneBefore(from: { checkpoint: string; batches_done: number }, runId: string): Promise<Set<string>> {
  let manifest: CheckpointManifest;
  try {
    manifest = await readManifest(from.checkpoint);
  } catch (e) {
    throw new HetpsError(`run ${runId} resumed from checkpoint ${from.checkpoint}, which this standby cannot read (${(e as Error).message}): `
      + 'a standby of a resumed run needs that checkpoint directory (the same checkpoint.dir, on this machine or shared storage)', { cause: e });
  }
  const done = new Set(manifest.data?.acked ?? []);
  if (done.size !== from.batches_done) {
    throw new HetpsError(`run ${runId} resumed from checkpoint ${from.checkpoint} with ${from.batches_done} batches done, but its manifest lists ${done.size}: not the checkpoint the run started from`);
  }
  return done;
}

async function markEnded(backend: JobBackend, runId: string): Promise<void> {
  const info = await backend.jobStore.get();
  if (info !== null && info.run_id === runId && info.ended !== true) await backend.jobStore.put({ ...info, ended: true });
}

/** nats.secure: the credentials' directory the config names (a local secure cluster gets its own at start); null otherwise. */
function configuredAuthDir(config: HetpsConfig): string | null {
  return config.nats.secure && config.nats.auth_dir !== null ? resolve(config.nats.auth_dir) : null;
}
