/**
 * `hetps up --config FILE`: the whole job on this machine. Reads and
 * validates the config, says which settings are not active yet, starts a
 * local 3-node NATS cluster (unless `nats.servers` is given), starts one
 * `hetps launch` process per node of the YAML (each worker profiles itself as
 * it joins; hps groups `cluster.worker_nodes` by those profiles), creates the
 * job (shard plan, the batch work queue with every epoch's batches, job info
 * with the groups), shows training progress, evaluates the trained
 * parameters on the test split, stops everything and writes a summary.
 *
 * Without a `nats-server` binary (and without `nats.servers`), or with
 * `--embedded`, the same actors run in this one process on the in-process
 * bus, with an in-memory work queue and plan store.
 */
import type { Command } from 'commander';
import { z } from 'zod';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { randomUUID } from 'node:crypto';
import { findNatsServer, startLocalCluster, type LocalCluster } from '../deploy/local-cluster.ts';
import {
  ActorSystem, ConfigError, HetpsError, InProcessBroker, JSON_CONTENT_TYPE, MissingDependencyError, SeededRandom, connectTransport, controlSubject,
  encode, hashString, systemClock, type Logger, type Transport,
} from '../runtime/mod.ts';
import { allWorkerNodes, groupsMeasuredAtStart, inactiveSettings, loadConfig, natsConnection, type HetpsConfig } from '../topology/mod.ts';
import { profileDevice, type DeviceProfile, type Evaluation, type ExecutionProvider } from '../native-bridge/mod.ts';
import { ackWaitFromConfig, createBatchStream, memoryBatchQueue, natsBatchQueue, type BatchQueue } from '../actors/store/batch-queue.ts';
import { sparseLayoutFromConfig } from '../actors/node/config-bridge.ts';
import { planJobGroups, prepareJob, profilesOf, waitForProfiles, type JobGrouping, type PreparedJob } from '../actors/scheduler/job.ts';
import {
  TrainingMonitor, type CurvePoint, type TrainingProgress, type TrainingReport, type UtilisationReport,
} from '../actors/monitor/training-monitor.ts';
import { EVAL_BATCH_MIN, ShardEvaluator, evaluateOnShards } from '../actors/monitor/evaluate.ts';
import { memoryJobInfoStore, natsJobInfoStore, resetNatsJobInfo, type JobInfoStore } from '../actors/store/job-info.ts';
import { DEFAULT_NODE_WAIT_MS, modelAndData, startServerNode, startWorkerNode, type ModelAndData } from '../actors/node/nodes.ts';
import { memoryPlanStore, natsConnectionOf, natsPlanStore, type PlanStore } from '../actors/store/plan-store.ts';
import { measureHostProfile, probeSettings } from '../actors/node/profile-reporter.ts';
import { memoryProfileStore, natsProfileStore, resetNatsProfiles, type ProfileStore } from '../actors/store/profile-store.ts';
import { RegroupController, type RegroupRecord } from '../actors/scheduler/regroup.ts';
import { ShardClient, shardStalenessSummary, type StalenessSummary } from '../actors/worker/shard-client.ts';
import { withJobName } from './launch.ts';
import { NodeProcesses, lineLogger } from './node-processes.ts';
import { cpuBetween, cpuSnapshot, type CpuProcess, type CpuReport, type CpuSnapshot } from './process-cpu.ts';

export interface UpFlags {
  config: string;
  summary?: string;
  embedded: boolean;
  /** commander's `--no-launch` */
  launch: boolean;
  skip?: string;
  job?: string;
  json: boolean;
  /** Seconds between evaluations on a test subset while training runs (commander passes a string); unset or 0: off. */
  evalEvery?: string;
  /** Test samples of those evaluations. */
  evalSamples?: string;
  /**
   * A JSON file of control commands the driver sends itself during training,
   * as any NATS client would (JSON request with the Content-Type header on
   * `hps.<job>.ctl.<command>`): `[{ "after_batches": n, "command": "regroup", "body": {…} }]`.
   * For tests and demos, embedded runs included; the replies go to the summary's `control_replies`.
   */
  ctlScript?: string;
}

const ctlScriptSchema = z.array(z.object({
  after_batches: z.number().int().nonnegative(),
  command: z.string().min(1),
  body: z.record(z.string(), z.unknown()).default({}),
}));

/** Test samples of the periodic evaluation unless --eval-samples says otherwise. */
export const DEFAULT_EVAL_SAMPLES = 4096;

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
  control_replies?: { after_batches: number; command: string; reply: unknown }[];
  /**
   * hps: the groups the job started with and how they were chosen: `criterion`
   * `config` for the YAML's worker_groups, `silhouette` or `fixed` for
   * cluster.worker_nodes grouped by the workers' profiles (listed in
   * `profiles`). null in asp / bsp.
   */
  grouping: JobGrouping | null;
}

/** Progress on stderr: a redrawn line on a terminal, a plain line every few seconds otherwise; other lines print above it. */
class Console {
  private bar: string | null = null;
  private lastLine = 0;
  constructor(private readonly out: NodeJS.WriteStream = process.stderr) {}
  private get tty(): boolean { return Boolean(this.out.isTTY); }
  line(s: string): void {
    if (this.tty && this.bar !== null) this.out.write('\r\x1b[2K');
    this.out.write(`${s}\n`);
    if (this.tty && this.bar !== null) this.out.write(this.bar);
  }
  progress(s: string, final = false): void {
    if (this.tty) {
      this.bar = s;
      this.out.write(`\r\x1b[2K${s}`);
      if (final) { this.out.write('\n'); this.bar = null; }
      return;
    }
    const now = performance.now();
    if (final || now - this.lastLine >= 5_000) { this.lastLine = now; this.out.write(`${s}\n`); }
  }
  end(): void {
    if (this.tty && this.bar !== null) this.out.write('\n');
    this.bar = null;
  }
}

function progressText(p: TrainingProgress, mode: string): string {
  const pct = p.total_samples > 0 ? Math.floor((100 * p.samples) / p.total_samples) : 100;
  return `training (${mode}): ${p.samples}/${p.total_samples} samples (${pct}%)  ${Math.round(p.samples_per_s)} samples/s  `
    + `loss ${p.loss === null ? '   -  ' : p.loss.toFixed(4)}${p.test_loss === null ? '' : `  test loss ${p.test_loss.toFixed(4)}`}  `
    + `batches ${p.batches_acked}/${p.total_batches}  ${p.elapsed_s.toFixed(0)} s`;
}

/** The not-active report: the file's inactive settings. */
export function notActiveReport(config: HetpsConfig): string[] {
  return inactiveSettings(config);
}

interface JobBackend {
  transport: Transport;
  system: ActorSystem;
  queue: BatchQueue;
  planStore: PlanStore;
  jobStore: JobInfoStore;
  /** The workers' profiles (each puts its own when it joins). */
  profileStore: ProfileStore;
  /** Starts the nodes (processes or in-process actors); may be called before the job exists. */
  startNodes(): Promise<void>;
  /** A reason to give up, checked while training runs. */
  check(): string | null;
  /** The processes whose CPU time counts as the job's (this one included). */
  cpuProcesses(): CpuProcess[];
  /** Ends the nodes after training and evaluation. */
  stopNodes(): Promise<void>;
  /** On Ctrl-C: ends the nodes at once (a few seconds' grace for processes). */
  kill(): Promise<void>;
  close(): Promise<void>;
}

export async function runUp(flags: UpFlags): Promise<UpSummary> {
  const t0 = performance.now();
  const configPath = resolve(flags.config);
  const config = withJobName(await loadConfig(configPath), flags.job);
  const job = config.job.name;
  const level = process.env.HETPS_LOG_LEVEL ?? config.logging.level;
  const con = new Console();
  const log = lineLogger(level, 'driver', (l) => con.line(l));
  const notActive = notActiveReport(config);
  if (notActive.length) {
    con.line('settings accepted but not active yet:');
    for (const l of notActive) con.line(`  - ${l}`);
  }
  const runId = `${new Date().toISOString().replace(/[:.]/g, '-')}-${randomUUID().slice(0, 6)}`;
  const runDir = resolve(config.job.run_dir, runId);
  await mkdir(runDir, { recursive: true });
  const workers = allWorkerNodes(config);
  const emulated: Record<string, number> = {};
  for (const w of workers) { const s = config.nodes[w.name]?.emulate?.speed; if (s !== undefined) emulated[w.name] = s; }
  const measured = groupsMeasuredAtStart(config);
  const groupsText = config.cluster.worker_groups.length > 0 ? `in ${config.cluster.worker_groups.length} group(s)`
    : measured ? 'to be grouped by their measured profiles' : 'without groups';
  con.line(`hetps up: job ${job} (${config.training.mode}), ${config.cluster.server_nodes.length} server(s), ${workers.length} worker(s) ${groupsText}; run dir ${runDir}`);
  if (Object.keys(emulated).length) {
    con.line(`emulated heterogeneity: ${Object.entries(emulated).map(([n, s]) => `${n} at speed ${s}`).join(', ')} (each step takes ${config.training.emulation_reference_step_ms} ms / speed; not real hardware)`);
  }

  const evalEveryS = flags.evalEvery === undefined ? 0 : Number(flags.evalEvery);
  if (!(evalEveryS >= 0)) throw new ConfigError(`--eval-every must be a number of seconds ≥ 0, got ${flags.evalEvery}`, { data: { field: '--eval-every' } });
  const evalSamples = flags.evalSamples === undefined ? DEFAULT_EVAL_SAMPLES : Number(flags.evalSamples);
  if (!Number.isInteger(evalSamples) || evalSamples <= 0) throw new ConfigError(`--eval-samples must be a positive integer, got ${flags.evalSamples}`, { data: { field: '--eval-samples' } });

  let ctlScript: z.infer<typeof ctlScriptSchema> = [];
  if (flags.ctlScript !== undefined) {
    const r = ctlScriptSchema.safeParse(JSON.parse(await readFile(resolve(flags.ctlScript), 'utf8')));
    if (!r.success) throw new ConfigError(`--ctl-script ${flags.ctlScript}: ${r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`, { data: { field: '--ctl-script' } });
    ctlScript = r.data;
  }
  const controlReplies: { after_batches: number; command: string; reply: unknown }[] = [];

  const md = modelAndData(config);
  const ackWaitMs = ackWaitFromConfig(config.fault_tolerance.worker_recovery_timeout);

  let servers = config.nats.servers;
  let cluster: LocalCluster | null = null;
  let embedded = flags.embedded;
  if (embedded && servers) con.line('hetps up: --embedded given: ignoring nats.servers, running every node in this process');
  if (!embedded && !servers) {
    try {
      findNatsServer();
      con.line('starting a local 3-node NATS cluster (random ports)');
      cluster = await startLocalCluster({
        nodes: 3, dir: join(runDir, 'nats'), clientPort: null, clusterPort: null, httpPort: null,
        maxPayload: config.nats.max_payload, jetstream: true, readyTimeoutMs: 60_000,
      });
      servers = cluster.urls;
      con.line(`NATS cluster up: ${servers.join(',')}`);
    } catch (e) {
      if (!(e instanceof MissingDependencyError)) throw e;
      con.line(`WARNING: ${e.message}`);
      con.line('WARNING: running the job embedded: every node in this one process on the in-process bus (no NATS)');
      embedded = true;
    }
  }

  let backend: JobBackend;
  try {
    backend = embedded
      ? await embeddedBackend(config, md, log, ackWaitMs, runId)
      : await natsBackend(config, servers!, log, ackWaitMs, runId, configPath, runDir, con, flags, level, cluster);
  } catch (e) {
    await cluster?.stop().catch(() => undefined);
    throw e;
  }

  let interrupted = false;
  const onSignal = (sig: NodeJS.Signals) => {
    if (interrupted) return;
    interrupted = true;
    con.end();
    con.line(`hetps up: got ${sig}; stopping every node${cluster ? ' and the NATS cluster' : ''}`);
    void (async () => {
      await backend.kill().catch(() => undefined);
      await cluster?.stop().catch(() => undefined);
      process.exit(sig === 'SIGINT' ? 130 : 143);
    })();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);

  const monitor = new TrainingMonitor(backend.transport, job, systemClock, log);
  let report: TrainingReport;
  let evaluation: Evaluation;
  let prepared: PreparedJob;
  let cpu: CpuReport | null = null;
  let staleness: StalenessSummary | null = null;
  let periodic: ShardEvaluator | null = null;
  let regrouper: RegroupController | null = null;
  let grouping: JobGrouping | null = null;
  const pendingCtl: Promise<void>[] = [];
  const sentCtl = new Set<number>();
  const shardClient = new ShardClient(backend.system, { requestTimeoutMs: 30_000, log, shouldStop: () => false });
  try {
    await backend.startNodes();
    if (measured) {
      // Every worker measures itself when it joins; the groups come from those profiles, before any worker trains.
      const names = workers.map((w) => w.name);
      const found = await waitForProfiles(backend.profileStore, names, {
        clock: systemClock, timeoutMs: DEFAULT_NODE_WAIT_MS, check: () => backend.check(),
        onProgress: (have, missing) => con.line(`waiting for profiles: ${have}/${names.length}${missing.length ? ` (missing: ${missing.join(', ')})` : ''}`),
      });
      grouping = planJobGroups(config, profilesOf(found, names));
    } else if (config.training.mode === 'hps') {
      grouping = planJobGroups(config, []);
    }
    if (grouping !== null) {
      con.line(`worker groups (${grouping.criterion === 'config' ? `as written in ${config.source.file}` : `measured: k=${grouping.k} by ${grouping.criterion}`}`
        + `${grouping.score === null ? '' : `, silhouette ${grouping.score}`}; ${grouping.reason}): `
        + grouping.groups.map((g) => `${g.name} [${g.nodes.join(', ')}] ${g.sync_mode}${g.sync_steps !== null ? ` every ${g.sync_steps}` : ''}`).join('; '));
      const emulatedProfiles = grouping.profiles.filter((p) => p.emulated).map((p) => p.node);
      if (emulatedProfiles.length) con.line(`note: the profiles of ${emulatedProfiles.join(', ')} are EMULATED (compute scaled by emulate.speed), not real hardware`);
    }
    prepared = await prepareJob({
      config, runId, maxPayload: backend.transport.bus.maxPayload, md, planStore: backend.planStore, jobStore: backend.jobStore, queue: backend.queue, ackWaitMs,
      groups: grouping?.criterion === 'config' ? null : grouping?.groups ?? null,
    });
    con.line(`job created: plan v${prepared.plan.version} (${prepared.plan.dense.length} dense blocks, ${prepared.plan.partitions} sparse partitions over ${prepared.plan.shards.join(', ')}), `
      + `${prepared.descriptors.length} batches of ${config.data.batch_size} over ${config.data.epochs} epoch(s) queued`
      + (prepared.info.mode === 'bsp' ? `, ${prepared.info.rounds} bsp rounds` : ''));
    if (evalEveryS > 0) {
      // One thread: the evaluation shares the machine with the nodes it measures.
      periodic = await ShardEvaluator.create({
        client: shardClient, plan: prepared.plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), source: md.source,
        batchSize: Math.max(config.data.batch_size, EVAL_BATCH_MIN), threads: 1, maxSamples: evalSamples,
      });
    }
    if (prepared.info.mode === 'hps') {
      regrouper = new RegroupController({
        transport: backend.transport, job, jobStore: backend.jobStore, info: prepared.info, clock: systemClock, log, profileStore: backend.profileStore,
        profiles: grouping?.profiles ?? [],
      });
    }
    const sendCtl = (batchesAcked: number) => {
      ctlScript.forEach((c, i) => {
        if (sentCtl.has(i) || batchesAcked < c.after_batches) return;
        sentCtl.add(i);
        con.line(`--ctl-script: sending ${c.command} after ${batchesAcked} batches`);
        pendingCtl.push((async () => {
          let reply: unknown;
          try {
            const m = await backend.transport.request(controlSubject(job, c.command), new TextEncoder().encode(JSON.stringify(c.body)),
              { timeoutMs: 30_000, headers: { 'Content-Type': JSON_CONTENT_TYPE } });
            reply = JSON.parse(new TextDecoder().decode(m.data));
          } catch (e) {
            reply = { error: (e as Error).message };
          }
          con.line(`--ctl-script: ${c.command} reply ${JSON.stringify(reply)}`);
          controlReplies.push({ after_batches: c.after_batches, command: c.command, reply });
        })());
      });
    };
    const evaluator = periodic;
    let cpuStart: CpuSnapshot | null = null;
    report = await monitor.supervise({
      queue: backend.queue, prepared,
      onProgress: (p) => { con.progress(progressText(p, config.training.mode)); sendCtl(p.batches_acked); },
      check: () => backend.check(),
      ...(evaluator ? { evaluation: { everyMs: evalEveryS * 1000, run: () => evaluator.evaluate() } } : {}),
      // Emulated nodes step at reference / speed: their busy time while their telemetry does not report one.
      nominalStepMs: (node) => (emulated[node] !== undefined ? config.training.emulation_reference_step_ms / emulated[node]! : null),
      onTrainingStart: () => { cpuStart = cpuSnapshot(backend.cpuProcesses()); },
      onTrainingEnd: () => { if (cpuStart) cpu = cpuBetween(cpuStart, cpuSnapshot(backend.cpuProcesses())); },
    });
    await Promise.all(pendingCtl);
    await regrouper?.dispose();
    con.end();
    for (const r of regrouper?.records ?? []) {
      con.line(`regroup v${r.groups_version} at ${r.at_s.toFixed(1)} s (${r.reason}): ${r.groups.map((g) => `${g.name} [${g.nodes.join(', ')}] ${g.sync_mode}`).join('; ')}; paused ${r.pause_s.toFixed(1)} s`);
    }
    con.line(`training done: ${report.batches_acked}/${report.batches} batches acknowledged (${report.duplicate_acks} duplicate acks), `
      + `${report.samples} samples in ${report.train_s.toFixed(1)} s (${Math.round(report.samples_per_s)} samples/s)`);
    con.line(`batches per worker: ${Object.entries(report.per_worker).sort().map(([n, c]) => `${n} ${c}${emulated[n] !== undefined ? ` (emulated speed ${emulated[n]})` : ''}`).join(', ')}`);
    const util = report.utilisation;
    if (Object.values(util.per_node).some((n) => n.busy_from !== 'none')) {
      con.line(`utilisation (busy / ${util.wall_s.toFixed(1)} s of training): mean ${(util.mean * 100).toFixed(0)}%; `
        + Object.entries(util.per_node).map(([n, u]) => `${n} ${(u.utilisation * 100).toFixed(0)}%`).join(', '));
    }
    // Assigned in onTrainingEnd above, which TypeScript's narrowing does not follow.
    const c = cpu as CpuReport | null;
    if (c) {
      con.line(`CPU while training: the job's processes used ${c.process_cpu_s.toFixed(1)} CPU-s in ${c.window_s.toFixed(1)} s on ${c.cores} cores `
        + `(${(c.cpu_busy_fraction * 100).toFixed(0)}% of the machine${c.machine_busy_fraction === null ? '' : `; whole machine ${(c.machine_busy_fraction * 100).toFixed(0)}% busy`})`);
    }
    con.line('evaluating the shards\' parameters on the test split');
    evaluation = await evaluateOnShards({
      client: shardClient,
      plan: prepared.plan, model: md.model, layout: sparseLayoutFromConfig(config, md.model), source: md.source,
      batchSize: Math.max(config.data.batch_size, EVAL_BATCH_MIN), threads: null,
    });
    staleness = await shardStalenessSummary(shardClient, prepared.plan.shards, log);
    if (staleness.count > 0) {
      con.line(`push staleness (updates behind the shard): mean ${staleness.mean.toFixed(2)}, max ${staleness.max}`
        + (staleness.max_staleness === null ? ' (measured only)' : `; ${staleness.scaled} applied at lr/(1+s), ${staleness.refused} refused beyond max_staleness ${staleness.max_staleness}`));
    }
    // A worker script may still be saving a checkpoint from the shards: let every live worker finish first.
    const gone = await monitor.waitForWorkers({ timeoutMs: 30_000, silenceMs: 5_000 });
    if (gone.length) con.line(`workers that never reported the end of their loop (gone?): ${gone.join(', ')}`);
  } finally {
    await regrouper?.dispose().catch(() => undefined);
    monitor.dispose();
    await periodic?.dispose().catch(() => undefined);
    con.end();
    await backend.stopNodes().catch((e: unknown) => log.warn({ err: (e as Error).message }, 'stopping the nodes failed'));
    await backend.close().catch(() => undefined);
    await cluster?.stop().catch(() => undefined);
    process.removeListener('SIGINT', onSignal);
    process.removeListener('SIGTERM', onSignal);
  }

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
    job, run_id: runId, run_dir: runDir,
    train_s: report.train_s,
    unconfirmed_acks: report.unconfirmed_acks,
    redelivered: report.redelivered,
    per_worker: report.per_worker,
    emulated,
    nats: embedded ? null : servers,
    not_active: notActive,
    eval_every_s: evalEveryS > 0 ? evalEveryS : null,
    eval_samples: evalEveryS > 0 ? Math.min(evalSamples, md.source.describe().testSize) : null,
    curve: report.curve,
    utilisation: report.utilisation,
    cpu,
    staleness,
    regroups: regrouper?.records ?? [],
    per_worker_group: report.per_worker_group,
    ...(flags.ctlScript !== undefined ? { control_replies: controlReplies } : {}),
    grouping,
  };
  const text = `${JSON.stringify(summary, null, 2)}\n`;
  await writeFile(join(runDir, 'summary.json'), text);
  if (flags.summary) await writeFile(resolve(flags.summary), text);
  return summary;
}

// ---------------------------------------------------------------- NATS: one process per node

async function natsBackend(
  config: HetpsConfig, servers: string[], log: Logger, ackWaitMs: number, runId: string, configPath: string, runDir: string,
  con: Console, flags: UpFlags, level: string, cluster: LocalCluster | null,
): Promise<JobBackend> {
  const job = config.job.name;
  const conn = natsConnection(config);
  const transport = await connectTransport({
    servers, name: 'hetps-driver', auth: conn.auth, tls: conn.tls, logger: log, pingIntervalMs: conn.pingIntervalMs, connectTimeoutMs: conn.connectTimeoutMs,
  });
  const nc = natsConnectionOf(transport)!;
  const system = new ActorSystem({ transport, job, node: 'driver', clock: systemClock, random: new SeededRandom(config.training.random_seed), logger: log });
  // A run of the same job name before this one (on a long-running NATS) must not feed this one.
  await resetNatsJobInfo(nc, job);
  await resetNatsProfiles(nc, job);
  const { replicas } = await createBatchStream(nc, job, { ackWaitMs, replicas: servers.length >= 3 ? 3 : 1, reset: true });
  log.debug({ replicas }, 'batch stream created');
  const queue = natsBatchQueue(nc, job);
  const skip = new Set((flags.skip ?? '').split(',').map((s) => s.trim()).filter(Boolean));
  const allNodes = [...config.cluster.server_nodes, ...allWorkerNodes(config).map((w) => w.name)];
  for (const s of skip) if (!allNodes.includes(s)) throw new ConfigError(`--skip ${s}: no such node in ${config.source.file} (${allNodes.join(', ')})`, { data: { field: '--skip' } });
  const procs = new NodeProcesses(join(runDir, 'logs'), (l) => con.line(l), { HETPS_LOG_LEVEL: level });
  const reported = new Set<string>();
  const common = ['--config', configPath, '--nats', servers.join(','), '--job', job, '--run-id', runId];
  const describeExit = (e: { code: number | null; signal: NodeJS.Signals | null }) => (e.signal ? `signal ${e.signal}` : `code ${e.code}`);

  return {
    transport, system, queue, planStore: natsPlanStore(nc, job), jobStore: natsJobInfoStore(nc, job), profileStore: natsProfileStore(nc, job),
    async startNodes() {
      if (!flags.launch) {
        con.line(`--no-launch: start the nodes yourself, e.g. hetps launch --role server --config ${flags.config} --server-id ${config.cluster.server_nodes[0]} --nats ${servers.join(',')} --job ${job}`);
        return;
      }
      // Every worker process runs on this machine: measured once here, before they start, instead of each
      // timing the same cores while the others load (they still apply their own emulation).
      const launched = allWorkerNodes(config).filter((w) => !skip.has(w.name));
      const hostFiles = new Map<ExecutionProvider, string>();
      for (const provider of new Set(launched.map((w) => config.nodes[w.name]?.provider ?? 'cpu'))) {
        const host = await measureHostProfile({ probeSeconds: config.cluster.profiling.probe_seconds, provider, transport, node: hostname() });
        const file = join(runDir, `host-profile-${provider}.json`);
        await writeFile(file, `${JSON.stringify(host, null, 2)}\n`);
        hostFiles.set(provider, file);
        con.line(`profiled this machine once for its ${launched.length} worker process(es): ${host.device.matmul_gflops} GFLOP/s matmul, `
          + `${host.device.gather_rows_per_s} rows/s gather (${provider})`
          + (host.network ? `, rtt ${host.network.rtt_ms} ms, ${host.network.bandwidth_mbps} Mbit/s to NATS` : ''));
      }
      for (const s of config.cluster.server_nodes) {
        if (skip.has(s)) continue;
        const host = hostFiles.get('cpu');
        procs.start({ name: s, role: 'server', args: ['--role', 'server', '--server-id', s, ...(host ? ['--host-profile', host] : []), ...common] });
      }
      for (const w of launched) {
        // A worker_nodes entry has no group yet: it is named, and takes its group from the job info.
        const which = w.group === null ? ['--node', w.name] : ['--group', w.group, '--node-rank', String(w.rank)];
        const host = hostFiles.get(config.nodes[w.name]?.provider ?? 'cpu');
        procs.start({ name: w.name, role: 'worker', args: ['--role', 'worker', ...which, ...(host ? ['--host-profile', host] : []), ...common] });
      }
      if (skip.size) con.line(`--skip: not starting ${[...skip].join(', ')}; start them yourself (hetps launch … --nats ${servers.join(',')} --job ${job})`);
    },
    cpuProcesses() {
      const out: CpuProcess[] = [{ name: 'driver', pid: null }];
      for (const n of procs.nodes) if (n.child.pid !== undefined) out.push({ name: n.spec.name, pid: n.child.pid });
      // The nats-servers this run started (a cluster given in nats.servers is not the job's own).
      for (const n of cluster?.nodes ?? []) out.push({ name: `nats:${n.name}`, pid: n.pid });
      return out;
    },
    check() {
      for (const n of procs.nodes) {
        if (n.exit === null || reported.has(n.spec.name)) continue;
        const abnormal = n.exit.signal !== null || n.exit.code !== 0;
        if (n.spec.role === 'server') return `server ${n.spec.name} exited (${describeExit(n.exit)}); shards have no failover yet`;
        if (abnormal && config.training.mode === 'bsp') {
          return `worker ${n.spec.name} exited (${describeExit(n.exit)}) and bsp rounds need every worker (no worker failover yet)`;
        }
        if (abnormal) {
          reported.add(n.spec.name);
          con.line(`worker ${n.spec.name} exited (${describeExit(n.exit)}): the batch it held goes back to the queue after ack_wait (${ackWaitMs / 1000} s)`);
        }
      }
      const launchedWorkers = procs.nodes.filter((n) => n.spec.role === 'worker');
      if (launchedWorkers.length > 0 && launchedWorkers.length === allWorkerNodes(config).length
        && launchedWorkers.every((n) => n.exit !== null) && launchedWorkers.some((n) => n.exit!.signal !== null || n.exit!.code !== 0)) {
        return 'every worker process has exited';
      }
      return null;
    },
    async stopNodes() {
      transport.publish(controlSubject(job, 'shutdown'), encode({ run_id: runId, reason: 'the job is done' }));
      await transport.flush().catch(() => undefined);
      await procs.stop(15_000);
    },
    async kill() {
      procs.killAll('SIGTERM');
      await Promise.race([Promise.all(procs.nodes.map((n) => n.exited)), new Promise((r) => setTimeout(r, 3_000).unref())]);
      procs.killAll('SIGKILL');
    },
    async close() {
      await queue.close();
      await system.stop();
      await transport.close();
    },
  };
}

// ---------------------------------------------------------------- embedded: every node in this process

async function embeddedBackend(config: HetpsConfig, md: ModelAndData, log: Logger, ackWaitMs: number, runId: string): Promise<JobBackend> {
  const job = config.job.name;
  const broker = new InProcessBroker(1 << 20);
  const transports: Transport[] = [];
  const systems: ActorSystem[] = [];
  const mk = async (name: string): Promise<ActorSystem> => {
    const t = await connectTransport({ servers: null, broker, name: `hetps-${name}` });
    transports.push(t);
    const s = new ActorSystem({
      transport: t, job, node: name, clock: systemClock, random: new SeededRandom(hashString(name, config.training.random_seed)), logger: log.child({ node: name }),
    });
    systems.push(s);
    return s;
  };
  const system = await mk('driver');
  const queue = memoryBatchQueue({ clock: systemClock, ackWaitMs });
  const planStore = memoryPlanStore();
  const jobStore = memoryJobInfoStore();
  const profileStore = memoryProfileStore();
  // One process is one device: measured once, shared by every worker (each applies its own emulation).
  const devices = new Map<ExecutionProvider, Promise<DeviceProfile>>();
  const sharedDevice = (provider: ExecutionProvider) => {
    let d = devices.get(provider);
    if (!d) { d = profileDevice({ ...probeSettings(config.cluster.profiling.probe_seconds, provider).device, node: 'embedded' }); devices.set(provider, d); }
    return d;
  };
  const failures: string[] = [];
  const starts: Promise<unknown>[] = [];
  const track = (what: string, p: Promise<unknown>) => {
    starts.push(p.catch((e: unknown) => { failures.push(`${what}: ${(e as Error).message}`); }));
  };
  return {
    transport: system.transport, system, queue, planStore, jobStore, profileStore,
    async startNodes() {
      for (const s of config.cluster.server_nodes) {
        track(`server ${s}`, mk(s).then((sys) => startServerNode({ config, server: s, system: sys, planStore, log: sys.log, md, profiling: { store: profileStore, device: sharedDevice } })));
      }
      for (const w of allWorkerNodes(config)) {
        track(`worker ${w.name}`, mk(w.name).then(async (sys) => {
          const started = await startWorkerNode({
            config, node: w, system: sys, planStore, jobStore, queue, log: sys.log, md, runId, profiling: { store: profileStore, device: sharedDevice },
          });
          const end = await started.def.done;
          if (end.state === 'failed') failures.push(`worker ${w.name} failed: ${end.error}`);
        }));
      }
    },
    check() { return failures.length ? failures.join('; ') : null; },
    // Every node runs in this process.
    cpuProcesses() { return [{ name: 'driver', pid: null }]; },
    async stopNodes() {
      // Workers first (their loops end), then shards, then the driver.
      await Promise.all(systems.slice(1).map((s) => s.stop({ timeoutMs: 15_000 })));
    },
    async kill() { await queue.close(); },
    async close() {
      await queue.close();
      await system.stop();
      await Promise.all(transports.map((t) => t.close()));
      void starts;
    },
  };
}

// ---------------------------------------------------------------- command

export function register(program: Command): void {
  program
    .command('up')
    .description('run a whole job on this machine: a local NATS cluster (or the embedded bus), one process per node, training, evaluation, summary')
    .requiredOption('--config <file>', 'job YAML')
    .option('--summary <file>', 'also write the summary JSON here (it always goes to <job.run_dir>/<run>/summary.json)')
    .option('--embedded', 'run every node in this process on the in-process bus, even when nats-server is installed', false)
    .option('--no-launch', 'start no node processes (start them with hetps launch; start order does not matter)')
    .option('--skip <nodes>', 'comma-separated nodes not to start (e.g. one you run through the API example)')
    .option('--job <name>', 'job name (default: job.name of the config)')
    .option('--json', 'print the summary as one JSON line on stdout', false)
    .option('--eval-every <seconds>', 'evaluate a test subset every this many seconds while training runs (the summary\'s curve); 0: off', '0')
    .option('--eval-samples <n>', 'test samples of each of those evaluations', String(DEFAULT_EVAL_SAMPLES))
    .option('--ctl-script <file>', 'JSON [{ after_batches, command, body }]: control commands the driver sends as a JSON NATS client during training (tests, demos); replies in the summary')
    .action(async (flags: UpFlags) => {
      let s: UpSummary;
      try {
        s = await runUp(flags);
      } catch (e) {
        if (e instanceof HetpsError) throw e;
        throw new HetpsError(`hetps up failed: ${(e as Error).message}`, { cause: e });
      }
      if (flags.json) process.stdout.write(`${JSON.stringify(s)}\n`);
      else {
        const metric = s.test_auc !== null ? `test AUC ${s.test_auc.toFixed(4)}` : `test accuracy ${((s.test_accuracy ?? NaN) * 100).toFixed(2)}%`;
        process.stdout.write(`done (${s.mode} over ${s.transport}): ${metric}, test logloss ${s.test_logloss.toFixed(4)}; ${s.samples} samples, `
          + `${Math.round(s.samples_per_s)} samples/s, ${s.batches_acked}/${s.batches} batches acknowledged (${s.duplicate_acks} duplicates), ${s.wall_s.toFixed(1)} s in all\n`
          + `summary: ${join(s.run_dir, 'summary.json')}\n`);
      }
      // onnxruntime's thread pool must not keep a finished job alive.
      process.exit(0);
    });
}
