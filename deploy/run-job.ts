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
 * Everything it says goes through a `JobPrinter`; the command line prints.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { randomUUID } from 'node:crypto';
import { findNatsServer, startLocalCluster, type LocalCluster } from './local-cluster.ts';
import { JSON_CONTENT_TYPE, MissingDependencyError, controlSubject, systemClock, type Actor, type NatsAuth, type NatsTls } from '../runtime/mod.ts';
import { allWorkerNodes, groupsMeasuredAtStart, inactiveSettings, natsConnection, type HetpsConfig } from '../topology/mod.ts';
import type { Evaluation } from '../native-bridge/mod.ts';
import { ackWaitFromConfig } from '../actors/store/batch-queue.ts';
import { sparseLayoutFromConfig } from '../actors/node/config-bridge.ts';
import { planJobGroups, prepareJob, profilesOf, waitForProfiles, type JobGrouping, type PreparedJob } from '../actors/scheduler/job.ts';
import {
  TrainingMonitor, type CurvePoint, type TrainingProgress, type TrainingReport, type UtilisationReport,
} from '../actors/monitor/training-monitor.ts';
import { EVAL_BATCH_MIN, ShardEvaluator, evaluateOnShards } from '../actors/monitor/evaluate.ts';
import { DEFAULT_NODE_WAIT_MS, modelAndData } from '../actors/node/nodes.ts';
import { RegroupController, type RegroupRecord } from '../actors/scheduler/regroup.ts';
import { startControlPlane } from '../actors/scheduler/control-plane.ts';
import { ShardFailover, createFailoverActor, type FailoverRecord, type ReplicaRecord } from '../actors/scheduler/failover.ts';
import { checkIntegrity, type IntegrityReport } from '../actors/scheduler/integrity.ts';
import { PlanView } from '../actors/store/plan-view.ts';
import { publishEvent } from '../actors/monitor/monitor.messages.ts';
import { ShardClient, shardStalenessSummary, type StalenessSummary } from '../actors/worker/shard-client.ts';
import { lineLogger } from './node-processes.ts';
import { cpuBetween, cpuSnapshot, type CpuReport, type CpuSnapshot } from './process-cpu.ts';
import type { JobBackend, JobContext, JobPrinter } from './job-backend.ts';
import { natsBackend } from './nats-backend.ts';
import { embeddedBackend } from './embedded-backend.ts';
import { setupStep } from './setup-step.ts';

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
  /** Log level; default HETPS_LOG_LEVEL, else logging.level of the config. */
  level?: string;
}

export interface UpSummary {
  mode: 'bsp' | 'asp' | 'hps';
  samples: number;
  samples_per_s: number;
  test_auc: number | null;
  test_logloss: number;
  test_accuracy?: number;
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
  /** Busy time / training window per worker. */
  utilisation: UtilisationReport;
  /** CPU time of the job's processes over the training window. */
  cpu: CpuReport | null;
  /** The shards' push staleness histogram (hps: with the pushes scaled and refused); null when the shards did not answer. */
  staleness: StalenessSummary | null;
  /** hps: the regroups during training (ctl.regroup commands and automatic ones), in order. */
  regroups: RegroupRecord[];
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

/** The run dir, the logger and the opening lines. */
async function describeRun(o: JobRunOptions, out: JobPrinter): Promise<JobContext & { emulated: Record<string, number>; notActive: string[] }> {
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
  const emulated: Record<string, number> = {};
  for (const w of workers) { const s = config.nodes[w.name]?.emulate?.speed; if (s !== undefined) emulated[w.name] = s; }
  const groupsText = config.cluster.worker_groups.length > 0 ? `in ${config.cluster.worker_groups.length} group(s)`
    : groupsMeasuredAtStart(config) ? 'to be grouped by their measured profiles' : 'without groups';
  out.line(`hetps up: job ${job} (${config.training.mode}), ${config.cluster.server_nodes.length} server(s), ${workers.length} worker(s) ${groupsText}; run dir ${runDir}`);
  if (Object.keys(emulated).length) {
    out.line(`emulated heterogeneity: ${Object.entries(emulated).map(([n, s]) => `${n} at speed ${s}`).join(', ')} (each step takes ${config.training.emulation_reference_step_ms} ms / speed; not real hardware)`);
  }
  return {
    config, job, configPath: o.configPath, configArg: o.configArg, runId, runDir, level, log, out,
    md: modelAndData(config), ackWaitMs: ackWaitFromConfig(config.fault_tolerance.worker_recovery_timeout), emulated, notActive,
  };
}

/** The NATS servers of the run: nats.servers, a local cluster started here, or none (embedded). */
async function startCluster(ctx: JobContext, embeddedFlag: boolean): Promise<{ servers: string[] | null; cluster: LocalCluster | null; embedded: boolean }> {
  const { config, out } = ctx;
  let servers = config.nats.servers;
  let cluster: LocalCluster | null = null;
  let embedded = embeddedFlag;
  if (embedded && servers) out.line('hetps up: --embedded given: ignoring nats.servers, running every node in this process');
  if (!embedded && !servers) {
    try {
      findNatsServer();
      out.line('starting a local 3-node NATS cluster (random ports)');
      cluster = await startLocalCluster({
        nodes: 3, dir: join(ctx.runDir, 'nats'), clientPort: null, clusterPort: null, httpPort: null,
        maxPayload: config.nats.max_payload, jetstream: true, readyTimeoutMs: 60_000,
      });
      servers = cluster.urls;
      out.line(`NATS cluster up: ${servers.join(',')}`);
    } catch (e) {
      if (!(e instanceof MissingDependencyError)) throw e;
      out.line(`WARNING: ${e.message}`);
      out.line('WARNING: running the job embedded: every node in this one process on the in-process bus (no NATS)');
      embedded = true;
    }
  }
  return { servers: embedded ? null : servers, cluster, embedded };
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

/** The shard plan, the queued batches and the job info (each store write a named set-up step in the NATS backend). */
async function createJob(ctx: JobContext, backend: JobBackend, grouping: JobGrouping | null): Promise<PreparedJob> {
  const { config, out } = ctx;
  const prepared = await prepareJob({
    config, runId: ctx.runId, maxPayload: backend.transport.bus.maxPayload, md: ctx.md, planStore: backend.planStore, jobStore: backend.jobStore,
    queue: backend.queue, ackWaitMs: ctx.ackWaitMs, groups: grouping?.criterion === 'config' ? null : grouping?.groups ?? null,
  });
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
    onProgress: (p) => { out.progress(progressText(p, config.training.mode)); control.onProgress(p.batches_acked); },
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
      + (staleness.max_staleness === null ? ' (measured only)' : `; ${staleness.scaled} applied at lr/(1+s), ${staleness.refused} refused beyond max_staleness ${staleness.max_staleness}`));
  }
  // A worker script may still be saving a checkpoint from the shards: let every live worker finish first.
  const gone = await monitor.waitForWorkers({ timeoutMs: 30_000, silenceMs: 5_000 });
  if (gone.length) out.line(`workers that never reported the end of their loop (gone?): ${gone.join(', ')}`);
  return { evaluation, staleness };
}

/** Ctrl-C / SIGTERM: end the nodes and the cluster, then exit. Returns the uninstaller. */
function onSignals(ctx: JobContext, backend: JobBackend, cluster: LocalCluster | null): () => void {
  let interrupted = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (interrupted) return;
    interrupted = true;
    ctx.out.end();
    ctx.out.line(`hetps up: got ${sig}; stopping every node${cluster ? ' and the NATS cluster' : ''}`);
    void (async () => {
      await backend.kill().catch(() => undefined);
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

async function writeSummary(summary: UpSummary, runDir: string, also: string | null): Promise<void> {
  const text = `${JSON.stringify(summary, null, 2)}\n`;
  await writeFile(join(runDir, 'summary.json'), text);
  if (also) await writeFile(resolve(also), text);
}

function natsAuthOf(config: HetpsConfig): { auth: NatsAuth | null; tls: NatsTls | null } {
  const c = natsConnection(config);
  return { auth: c.auth, tls: c.tls };
}

// ---------------------------------------------------------------- the run

/** Runs the job to its end and returns the summary (also written to `<run dir>/summary.json`). */
export async function runJob(o: JobRunOptions, out: JobPrinter): Promise<UpSummary> {
  const t0 = performance.now();
  const ctx = await describeRun(o, out);
  const { config, job, md, log } = ctx;

  const { servers, cluster, embedded } = await startCluster(ctx, o.embedded);
  let backend: JobBackend;
  try {
    backend = servers === null
      ? await embeddedBackend(ctx)
      : await natsBackend(ctx, { servers, cluster, launch: o.launch, skip: o.skip });
  } catch (e) {
    await cluster?.stop().catch(() => undefined);
    throw e;
  }
  const removeSignalHandlers = onSignals(ctx, backend, cluster);

  // The control plane first: it hears every node from its first heartbeat and report.
  let shutdownRequested: string | null = null;
  const plane = await startControlPlane(backend.system, {
    policy: { heartbeatMs: config.fault_tolerance.heartbeat_ms, deadAfterMs: config.fault_tolerance.dead_after_ms }, log,
    onShutdown: (reason) => { shutdownRequested = reason; },
    nats: servers === null ? null : { servers, ...natsAuthOf(config) },
  });
  backend.onNodeExit((node, how) => plane.nodeExited(node, how));
  const monitor = plane.monitor.training;
  const check = () => (shutdownRequested !== null ? `ctl.shutdown: ${shutdownRequested}` : backend.check());
  let shardClient!: ShardClient;
  let failover: ShardFailover | null = null;
  let failoverActor: Actor<never> | null = null;
  let integrity: IntegrityReport | null = null;
  const control = new ControlScript(ctx, backend, o.ctlScript ?? []);
  let periodic: ShardEvaluator | null = null;
  let regrouper: RegroupController | null = null;
  let grouping: JobGrouping | null;
  let trained: Supervised;
  let evaluated: { evaluation: Evaluation; staleness: StalenessSummary };
  try {
    grouping = await startNodesAndPlanGroups(ctx, backend, servers ?? []);
    const prepared = await createJob(ctx, backend, grouping);
    shardClient = new ShardClient(backend.system, { requestTimeoutMs: 30_000, log, shouldStop: () => false, plans: PlanView.follow(prepared.plan, backend.planStore) });
    if (servers !== null) {
      // Failover acts on the health actor's verdicts; the embedded mode has one process, nothing to fail over to.
      failover = new ShardFailover({
        planStore: backend.planStore, health: plane.health, servers: config.cluster.server_nodes, backupFactor: config.fault_tolerance.backup_factor,
        transport: backend.transport, job, clock: systemClock, log,
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
    // Every mode can be paused; regrouping (and its automatic trigger) is hps only.
    regrouper = new RegroupController({
      transport: backend.transport, job, jobStore: backend.jobStore, info: prepared.info, clock: systemClock, log, profileStore: backend.profileStore,
      profiles: grouping?.profiles ?? [],
      isDead: (node) => plane.health.stateOf(node) === 'dead',
      onPaused: (v, workers) => {
        out.line(`paused: every live worker stopped at its boundary (${workers.join(', ')}); send ctl.resume to continue`);
        publishEvent(backend.transport, job, 'scheduler', { kind: 'paused', node: null, text: `every live worker paused (groups v${v})` });
      },
    });
    const controller = regrouper;
    plane.monitor.setTotalBatches(prepared.info.total_batches);
    plane.scheduler.attach({ info: () => controller.jobInfo, plan: () => shardClient.plans.current, controller });
    trained = await supervise(ctx, backend, monitor, prepared, ctx.emulated, periodic, o.evalEveryS, control, check);
    plane.scheduler.setEnded('stopping');
    await control.settled();
    await regrouper?.dispose();
    out.end();
    printTraining(out, trained, regrouper?.records ?? [], ctx.emulated);
    evaluated = await evaluate(ctx, shardClient, monitor, prepared);
    await failover?.settled();
    const finalPlan = await shardClient.plans.refresh();
    integrity = await checkIntegrity({ system: backend.system, plan: finalPlan, acked: monitor.ackedBatches(), clock: systemClock, log });
    out.line(`integrity: ${integrity.acked} batches acknowledged, ${integrity.applied} applied on every shard, ${integrity.lost} lost, ${integrity.duplicated} applied twice`
      + `${integrity.dropped_stale ? `, ${integrity.dropped_stale} dropped as too stale` : ''}; replicas ${integrity.replicas_equal === null ? 'not all checked' : integrity.replicas_equal ? 'equal' : 'DIFFER'}`
      + ` (plan v${finalPlan.version}${failover && failover.failovers.length ? `, ${failover.failovers.length} failover(s)` : ''})`);
    if (integrity.lost || integrity.duplicated) log.warn({ lost: integrity.lost_examples, duplicated: integrity.duplicated_examples }, 'integrity check found lost or duplicated batches');
  } finally {
    failover?.dispose();
    if (failoverActor) await backend.system.despawn(failoverActor).catch(() => undefined);
    await regrouper?.dispose().catch(() => undefined);
    await plane.stop();
    await periodic?.dispose().catch(() => undefined);
    out.end();
    await backend.stopNodes().catch((e: unknown) => log.warn({ err: (e as Error).message }, 'stopping the nodes failed'));
    await backend.close().catch(() => undefined);
    await cluster?.stop().catch(() => undefined);
    removeSignalHandlers();
  }

  const { report, cpu } = trained;
  const { evaluation, staleness } = evaluated;
  const summary: UpSummary = {
    mode: config.training.mode,
    samples: report.samples,
    samples_per_s: report.samples_per_s,
    test_auc: evaluation.kind === 'ctr' ? evaluation.auc : null,
    test_logloss: evaluation.logloss,
    ...(evaluation.kind === 'mlp' ? { test_accuracy: evaluation.accuracy } : {}),
    wall_s: (performance.now() - t0) / 1000,
    transport: embedded ? 'embedded' : 'nats',
    batches: report.batches,
    batches_acked: report.batches_acked,
    duplicate_acks: report.duplicate_acks,
    job, run_id: ctx.runId, run_dir: ctx.runDir,
    train_s: report.train_s,
    unconfirmed_acks: report.unconfirmed_acks,
    redelivered: report.redelivered,
    per_worker: report.per_worker,
    emulated: ctx.emulated,
    nats: servers,
    not_active: ctx.notActive,
    eval_every_s: o.evalEveryS > 0 ? o.evalEveryS : null,
    eval_samples: o.evalEveryS > 0 ? Math.min(o.evalSamples, md.source.describe().testSize) : null,
    curve: report.curve,
    utilisation: report.utilisation,
    cpu,
    staleness,
    regroups: regrouper?.records ?? [],
    per_worker_group: report.per_worker_group,
    ...(o.ctlScript !== null ? { control_replies: control.replies } : {}),
    grouping,
    integrity,
    replication: {
      backup_factor: config.fault_tolerance.backup_factor,
      mode: config.fault_tolerance.replication,
      failovers: failover?.failovers ?? [],
      replicas_added: failover?.replicas ?? [],
      shards_lost: failover ? [...failover.lost] : [],
      unprotected: failover?.report().unprotected ?? [],
      client_reroutes: shardClient.rerouted,
    },
  };
  await writeSummary(summary, ctx.runDir, o.summaryPath);
  return summary;
}
