/**
 * The reference article's Python API, in TypeScript: a training script runs
 * as one node of a job that `hetps up` drives.
 *
 *   const hps = new HeterogeneousParameterServer({ configFile: 'job.yaml', role: 'worker', groupName: 'fast', nodeRank: 0 });
 *   await hps.init();
 *   const optimizer = hps.wrapOptimizer({ type: 'adam', learningRate: 0.002 });
 *   for await (const batch of hps.shardDataloader({ dataset: hps.dataset, batchSize: 32 })) {
 *     const loss = await optimizer.step(batch);
 *   }
 *   await hps.saveCheckpoint({ path: './checkpoints/epoch_2', sync: true });
 *   await hps.close();
 *
 * The servers apply the updates, so the optimizer is the config's
 * (`optimizer:`); `wrapOptimizer` checks that the script asks for the same
 * one. `shardDataloader` hands out this worker's share of the job's batches:
 * it takes them from the job's work queue when the script is ready for the
 * next, so a fast node trains more of them. Each batch is acknowledged by
 * `optimizer.step` once every shard has its gradients — or, for a worker in
 * an hps group that reduces together, with its group window (api-group.ts):
 * `step` resolves with the loss as soon as the window trained the batch, and
 * `close` takes part in the group's last windows until it agrees the job
 * is done.
 */
import { readManifest, type CheckpointManifest } from '../store/checkpoint.ts';
import { resolve } from 'node:path';
import {
  ActorSystem, ConfigError, HetpsError, JSON_CONTENT_TYPE, NoRespondersError, SeededRandom, connectTransport, controlSubject, createLogger, decode, hashString, systemClock,
  type Logger, type Transport,
} from '../../runtime/mod.ts';
import { heldBandwidthMbps, loadConfig, natsConnectionAs, nodeOverrides, type HetpsConfig, type OptimizerType, type ShardPlan, type WorkerNode } from '../../topology/mod.ts';
import { StepSession, type Batch, type DataSource } from '../../native-bridge/mod.ts';
import { natsBatchQueue, type BatchDescriptor, type BatchQueue, type QueuedBatch } from '../store/batch-queue.ts';
import { sparseLayoutFromConfig } from '../node/config-bridge.ts';
import { GroupWindows } from './api-group.ts';
import { GroupMember, type WindowOutcome } from '../group/group-sync.ts';
import { LoopControl, startVersion } from '../worker/loop-control.ts';
import type { WorkerLoopState } from '../worker/worker.messages.ts';
import { ThreadedHeartbeat } from '../health/heartbeat.ts';
import { HealthWatcher } from '../health/health-watcher.ts';
import { groupOfWorker, natsJobInfoStore, waitForJobInfo, type JobInfo } from '../store/job-info.ts';
import { DEFAULT_NODE_WAIT_MS, UNGROUPED, groupLrRuleFromConfig, localOptimizersFromConfig, measuredLinkMbps, modelAndData, startServerNode, waitForPlan, workerCompressionOptions, workerNodeByName, workerNodeOf, type ModelAndData } from '../node/nodes.ts';
import { natsConnectionOf, natsPlanStore } from '../store/plan-store.ts';
import { ProfileReporter } from '../node/profile-reporter.ts';
import { natsProfileStore } from '../store/profile-store.ts';
import { publishTelemetry } from '../monitor/telemetry.ts';
import { PlanView } from '../store/plan-view.ts';
import { ShardClient, waitForShards } from '../worker/shard-client.ts';
import { WorkerStepper, batchFromDescriptor } from '../worker/step.ts';

export interface HeterogeneousParameterServerOptions {
  configFile: string;
  role: 'worker' | 'server';
  /** Worker: the group in `cluster.worker_groups`. */
  groupName?: string;
  /** Worker, instead of groupName / nodeRank: the worker by name (the only way to name one of `cluster.worker_nodes`). */
  nodeName?: string;
  /** Worker: position in the group, from 0. */
  nodeRank?: number;
  /** Server: one of `cluster.server_nodes`. */
  serverId?: string;
  /** NATS URLs; default: `nats.servers` of the config, else the `HETPS_NATS` environment variable (comma-separated). */
  natsServers?: string[];
  /** Job name; default: `job.name` of the config. */
  job?: string;
  /** How long `init` waits for the driver and the shards. Default 120 s. */
  waitMs?: number;
  logger?: Logger;
}

/** A batch handed out by `shardDataloader`, trained and acknowledged by `optimizer.step`. */
export interface WorkBatch {
  readonly desc: BatchDescriptor;
  readonly batch: Batch;
  /** bsp round, null otherwise. */
  readonly round: number | null;
  /** @internal */
  readonly item: QueuedBatch;
}

export interface WrapOptimizerOptions {
  type: OptimizerType;
  learningRate: number;
}

export interface DistributedOptimizer {
  readonly type: OptimizerType;
  readonly learningRate: number;
  /** Pulls, runs the step, pushes to every owning shard, acknowledges the batch; returns the batch loss. */
  step(batch: WorkBatch): Promise<number>;
}

export type { CheckpointManifest };

/** How long `saveCheckpoint` waits for the driver: its pause (60 s at most) and the writing of the files. */
const CHECKPOINT_REPLY_MS = 300_000;

export class HeterogeneousParameterServer {
  private cfg: HetpsConfig | null = null;
  private transport: Transport | null = null;
  private system: ActorSystem | null = null;
  private log: Logger;
  private md: ModelAndData | null = null;
  private plan: ShardPlan | null = null;
  private info: JobInfo | null = null;
  private queue: BatchQueue | null = null;
  private client: ShardClient | null = null;
  private stepper: WorkerStepper | null = null;
  private session: StepSession | null = null;
  private workerNode: WorkerNode | null = null;
  private profile: ProfileReporter | null = null;
  private pendingCheckpoints: Promise<unknown>[] = [];
  /** The job-wide pauses this worker follows (null: a server, or before init). */
  private control: LoopControl | null = null;
  private readonly loopState: { state: WorkerLoopState } = { state: 'starting' };
  private heartbeat: ThreadedHeartbeat | null = null;
  private health: HealthWatcher | null = null;
  private windows: GroupWindows | null = null;
  private stats = { steps: 0, samples: 0, acked: 0 };
  private closed = false;
  private closing = false;

  constructor(private readonly opts: HeterogeneousParameterServerOptions) {
    this.log = opts.logger ?? createLogger({ name: opts.serverId ?? opts.nodeName ?? `${opts.groupName ?? 'worker'}-${opts.nodeRank ?? 0}`, stderr: true });
  }

  get config(): HetpsConfig { return this.need(this.cfg, 'config'); }
  /** This node's name in the YAML. */
  get node(): string { return this.opts.role === 'server' ? this.opts.serverId! : this.need(this.workerNode, 'node').name; }
  /** The job's data source (the config's `data:`), for `shardDataloader`. */
  get dataset(): DataSource { return this.need(this.md, 'dataset').source; }
  get job(): JobInfo { return this.need(this.info, 'job'); }

  /** Connects, and waits for the driver: a server starts serving its shard, a worker for the job, the plan and every shard. */
  async init(): Promise<void> {
    const o = this.opts;
    let config = await loadConfig(resolve(o.configFile));
    if (o.job) config = { ...config, job: { ...config.job, name: o.job } };
    this.cfg = config;
    const servers = o.natsServers ?? config.nats.servers ?? (process.env.HETPS_NATS ? process.env.HETPS_NATS.split(',').map((s) => s.trim()).filter(Boolean) : null);
    if (!servers || servers.length === 0) throw new ConfigError('HeterogeneousParameterServer needs NATS: pass natsServers, set nats.servers in the config or HETPS_NATS (the URLs `hetps up` prints)');
    let node: string;
    if (o.role === 'server') {
      if (!o.serverId) throw new ConfigError('role server needs serverId');
      node = o.serverId;
    } else if (o.role === 'worker') {
      if (o.nodeName !== undefined && o.groupName !== undefined) throw new ConfigError('role worker takes nodeName or groupName (with nodeRank), not both');
      if (o.nodeName === undefined && !o.groupName) throw new ConfigError('role worker needs nodeName, or groupName and nodeRank');
      this.workerNode = o.nodeName !== undefined ? workerNodeByName(config, o.nodeName) : workerNodeOf(config, o.groupName!, o.nodeRank ?? 0);
      node = this.workerNode.name;
    } else {
      throw new ConfigError(`role must be worker or server, got ${JSON.stringify(o.role)}`);
    }
    // Secure (nats.secure): the shard role for a server, the worker role for a worker.
    const conn = natsConnectionAs(config, o.role === 'server' ? 'shard' : 'worker', null, o.role === 'server' ? node : null);
    this.transport = await connectTransport({ servers, name: `hetps-api-${node}`, auth: conn.auth, tls: conn.tls, logger: this.log, connectTimeoutMs: conn.connectTimeoutMs, maxMessageBytes: conn.maxMessageBytes });
    const nc = natsConnectionOf(this.transport)!;
    const job = config.job.name;
    this.system = new ActorSystem({
      transport: this.transport, job, node, clock: systemClock, random: new SeededRandom(hashString(node, config.training.random_seed)), logger: this.log,
    });
    // A node like a launched one: its heartbeat (from a thread of its own) tells the health actor it is there.
    let state = 'starting';
    this.heartbeat = new ThreadedHeartbeat({
      servers, auth: conn.auth, tls: conn.tls, job, node, role: o.role === 'server' ? 'shard' : 'worker', incarnation: this.system.senderId,
      periodMs: config.fault_tolerance.heartbeat_ms, clock: systemClock, state: () => (this.closed ? 'stopping' : state),
    });
    const planStore = natsPlanStore(nc, job);
    const waitMs = o.waitMs ?? DEFAULT_NODE_WAIT_MS;
    this.md = modelAndData(config);
    if (o.role === 'server') {
      ({ plan: this.plan } = await startServerNode({ config, server: node, system: this.system, planStore, log: this.log, md: this.md, waitMs }));
      state = 'serving';
      return;
    }
    const overrides = nodeOverrides(config, node);
    // Measured and published like a launched worker's, so the driver can group this node too.
    this.profile = await ProfileReporter.join({
      transport: this.transport, job, node, emulate: overrides.emulate, provider: overrides.provider ?? 'cpu', store: natsProfileStore(nc, job),
      clock: systemClock, log: this.log, probeSeconds: config.cluster.profiling.probe_seconds, republishMs: config.cluster.profiling.republish_seconds * 1000,
    });
    this.profile.keepStored();
    try {
      this.info = await waitForJobInfo(natsJobInfoStore(nc, job), {
        clock: systemClock, timeoutMs: waitMs,
        onWait: (ms) => this.log.info(ms === 0 ? `worker ${node} ready; waiting for the job` : `worker ${node} still waiting for the job`),
      });
    } finally {
      this.profile.stopRefreshing();
    }
    if (!this.info.workers.includes(node)) throw new ConfigError(`worker ${node} is not one of the job's workers (${this.info.workers.join(', ')})`);
    this.plan = await waitForPlan(planStore, { clock: systemClock, timeoutMs: waitMs, log: this.log });
    await waitForShards(this.system, this.plan, { timeoutMs: waitMs, log: this.log });
    this.client = new ShardClient(this.system, { requestTimeoutMs: 10_000, log: this.log, shouldStop: () => this.closed, plans: PlanView.follow(this.plan, planStore) });
    this.queue = natsBatchQueue(nc, job);
    this.session = await StepSession.create(this.md.model, { provider: overrides.provider ?? 'cpu', intraOpNumThreads: overrides.threads ?? 1, graph: 'step' });
    this.stepper = new WorkerStepper({
      client: this.client, plan: this.plan, model: this.md.model, layout: sparseLayoutFromConfig(config, this.md.model), session: this.session,
      clock: systemClock, log: this.log, emulateSpeed: overrides.emulate?.speed ?? null,
      // Its link as a launched worker's: emulated when the config says so, else measured by its profile.
      bandwidthMbps: heldBandwidthMbps(overrides.emulate), measuredBandwidthMbps: measuredLinkMbps(this.profile),
      // hps: local updates between a window's steps, as a launched worker's (training.local_updates).
      localOptimizers: this.info.mode === 'hps' ? localOptimizersFromConfig(config) : null,
      node, ...workerCompressionOptions(config),
    });
    const group = this.info.mode === 'hps' ? groupOfWorker(this.info, config, node) : null;
    publishTelemetry(this.transport, job, 'start', node, {
      node, group: group?.name ?? this.workerNode!.group ?? UNGROUPED, mode: this.info.mode, emulated_speed: overrides.emulate?.speed ?? null, sync_mode: group?.sync_mode ?? null,
    });
    // Job-wide pauses (ctl.pause, a checkpoint's cut, a regroup) reach this worker as they reach a launched one.
    const control = this.control = new LoopControl({
      node, runId: this.info.run_id, groupsVersion: startVersion(this.info), store: natsJobInfoStore(nc, job), resumeTimeoutMs: 120_000, stats: this.loopState,
    });
    await control.start({ transport: this.transport, job, clock: systemClock, log: this.log });
    if (group !== null) {
      // hps: a member of its group's windows, like a launched worker (an async group's member pushes each step).
      const queue = this.queue;
      const info = this.info;
      const system = this.system;
      const stepper = this.stepper;
      const plan = this.plan;
      const health = this.health = await HealthWatcher.start(this.system);
      this.windows = new GroupWindows({
        group, control, keepAliveMs: Math.floor(info.ack_wait_ms / 3),
        groupIn: (i) => groupOfWorker(i, config, node),
        member: async (g) => {
          const version = control.groupsVersion;
          // The run id carries the groups version, so a late message of an earlier membership never reaches this one.
          const m = new GroupMember({
            system, group: g, member: node, runId: version === 0 ? info.run_id : `${info.run_id}/g${version}`, plan, stepper, log: this.log,
            shouldStop: () => this.closed, recoveryTimeoutMs: info.recovery_timeout_ms ?? info.ack_wait_ms, health,
            groupsVersionSeen: () => control.seen, closeEarly: () => control.jobPausePending, groupLr: groupLrRuleFromConfig(config),
            streamSlices: config.training.stream_slices, directPush: config.training.group_update === 'direct',
          });
          await m.start();
          return m;
        },
        log: this.log, shouldStop: () => this.closed,
        drained: async () => (await queue.pending().catch(() => 1)) === 0,
        onWindow: (held, outcome, g) => this.acknowledgeWindow(held, outcome, g.name),
      });
    }
    this.profile.startTraining();
    state = 'training';
  }

  /** A group window's batches, acknowledged once the group's update of them is out, and reported. */
  private async acknowledgeWindow(held: readonly QueuedBatch[], outcome: WindowOutcome, group: string): Promise<void> {
    await Promise.all(held.map(async (item, i) => {
      const s = outcome.steps[i]!;
      const confirmed = await item.ack();
      this.profile?.noteStep(s.stepMs);
      this.stats.steps++;
      this.stats.samples += s.samples;
      if (confirmed) this.stats.acked++;
      publishTelemetry(this.transport!, this.job.job, 'batch', this.node, {
        node: this.node, batch_id: item.desc.batch_id, samples: s.samples, loss: s.loss, redelivered: item.redelivered, ack_confirmed: confirmed,
        staleness: outcome.staleness, round: null, busy_ms: s.computeMs, emulated_step_ms: s.stepMs, dropped_stale: outcome.droppedStale, part_dropped: outcome.partDropped, window: outcome.window, group,
      });
    }));
  }

  /**
   * The optimizer as the servers run it. The servers apply the updates with
   * the config's `optimizer:` settings, so a script asking for another type
   * or learning rate is told so rather than silently overruled.
   */
  wrapOptimizer(o: WrapOptimizerOptions): DistributedOptimizer {
    const config = this.config;
    const want = config.optimizer;
    if (o.type !== want.type || Math.abs(o.learningRate - want.learning_rate) > 1e-12 * Math.max(1, want.learning_rate)) {
      throw new ConfigError(`wrapOptimizer({ type: ${o.type}, learningRate: ${o.learningRate} }): the servers apply the config's optimizer `
        + `(type ${want.type}, learning_rate ${want.learning_rate} in ${config.source.file}); set it there`, { data: { field: 'optimizer' } });
    }
    return { type: o.type, learningRate: o.learningRate, step: (b) => this.trainStep(b) };
  }

  /**
   * This worker's batches: taken from the job's work queue when the loop asks
   * for the next one, until every batch of the job is acknowledged (asp) or
   * every round is done (bsp; a round without a batch for this worker is
   * contributed empty here, so it never reaches the loop).
   */
  async *shardDataloader(o: { dataset?: DataSource; batchSize: number }): AsyncGenerator<WorkBatch> {
    const info = this.job;
    if (o.batchSize !== info.batch_size) {
      throw new ConfigError(`shardDataloader({ batchSize: ${o.batchSize} }): the job's batches have ${info.batch_size} samples (data.batch_size); the driver queued them that way`);
    }
    const source = o.dataset ?? this.dataset;
    const queue = this.need(this.queue, 'queue');
    if (info.mode === 'bsp') {
      for (let r = 0; r < info.rounds && !this.closed; r++) {
        // Between rounds, holding no batch: a job-wide pause is taken here.
        await this.atBoundary();
        const item = await queue.next(1_500);
        if (item === null) { await this.stepper!.run(null, { round: r, expected: info.workers.length }); continue; }
        yield { desc: item.desc, batch: batchFromDescriptor(source, item.desc), round: r, item };
      }
      return;
    }
    while (!this.closed) {
      // asp: between batches, holding none (hps: the group windows take pauses at their window boundary).
      if (this.windows === null) await this.atBoundary();
      const item = await queue.next(1_000);
      if (item === null) {
        // A group window in progress closes with the batches it has rather than wait for one.
        this.windows?.noBatchNow();
        if ((await queue.pending().catch(() => 1)) === 0) return;
        continue;
      }
      yield { desc: item.desc, batch: batchFromDescriptor(source, item.desc), round: null, item };
    }
  }

  private async trainStep(b: WorkBatch): Promise<number> {
    const info = this.job;
    if (this.windows !== null) {
      // Trained in this worker's group window; acknowledged with the window (acknowledgeWindow).
      const s = await this.windows.step(b.batch, b.item);
      return s.loss;
    }
    const sync = b.round === null ? null : { round: b.round, expected: info.workers.length };
    let out;
    try {
      out = await this.need(this.stepper, 'stepper').run(b.batch, sync);
    } catch (e) {
      b.item.nak();
      throw e;
    }
    const confirmed = await b.item.ack();
    this.profile?.noteStep(out.stepMs);
    this.stats.steps++;
    this.stats.samples += out.samples;
    if (confirmed) this.stats.acked++;
    publishTelemetry(this.transport!, info.job, 'batch', this.node, {
      node: this.node, batch_id: b.desc.batch_id, samples: out.samples, loss: out.loss ?? 0, redelivered: b.item.redelivered,
      ack_confirmed: confirmed, staleness: out.staleness, round: b.round,
    });
    return out.loss ?? NaN;
  }

  /**
   * A coordinated checkpoint of the whole job, written at `path` (a directory
   * that must not exist yet): the same cut as `ctl.checkpoint` and the
   * periodic ones — the driver pauses every worker at its window or step
   * boundary (this one too), freezes every shard, resumes, and writes one
   * full checkpoint there (`<shard>.msgpack` per shard plus `manifest.json`
   * with the acknowledged batches and each file's size and SHA-256, fsynced
   * and renamed into place; `hetps checkpoint verify path` checks it, and
   * `hetps up --resume path` resumes from it). The driver writes it: a
   * relative path is resolved here, so give one that means the same on the
   * driver's machine. `sync: true` resolves with the manifest once it is
   * written; `sync: false` returns at once (`close` waits for it).
   */
  async saveCheckpoint(o: { path: string; sync?: boolean }): Promise<CheckpointManifest | null> {
    const work = this.checkpointThroughDriver(resolve(o.path));
    if (o.sync ?? true) return work;
    this.pendingCheckpoints.push(work.catch((e: unknown) => this.log.error({ err: e }, 'checkpoint failed')));
    return null;
  }

  private async checkpointThroughDriver(path: string): Promise<CheckpointManifest> {
    const transport = this.need(this.transport, 'transport');
    const job = this.config.job.name;
    const subject = controlSubject(job, 'checkpoint');
    const reply = transport.request(subject, new TextEncoder().encode(JSON.stringify({ path, trigger: 'api' })), { timeoutMs: CHECKPOINT_REPLY_MS, headers: { 'Content-Type': JSON_CONTENT_TYPE } })
      .then((m) => {
        const r = JSON.parse(new TextDecoder().decode(m.data)) as { type?: string; result?: { path: string }; error?: { message?: string } };
        if (r.type !== 'reply' || r.result === undefined) throw new HetpsError(`saveCheckpoint(${path}): the driver refused: ${r.error?.message ?? JSON.stringify(r)}`);
        return r.result;
      }, (e: unknown) => {
        throw new HetpsError(e instanceof NoRespondersError
          ? `saveCheckpoint(${path}): no driver answers on ${subject} (the job has ended, or its driver is down); a checkpoint is the driver's coordinated cut`
          : `saveCheckpoint(${path}): no answer from the driver on ${subject} (${(e as Error).message})`, { cause: e });
      });
    // A script waiting here holds no batch: it is at its boundary, so it takes the cut's pause here.
    await this.boundaryUntil(reply);
    await reply;
    return readManifest(path);
  }

  /** asp / bsp: a job-wide pause pending is taken now (this worker holds no batch); returns when training may go on. */
  private async atBoundary(): Promise<void> {
    const c = this.control;
    if (c !== null && this.windows === null) await c.atBoundary(() => this.workerNode?.group ?? UNGROUPED);
  }

  /** Takes every job-wide pause that comes before `p` settles (asp / bsp; hps groups pause in their windows). */
  private async boundaryUntil(p: Promise<unknown>): Promise<void> {
    const c = this.control;
    if (c === null || this.windows !== null) return;
    let settled = false;
    const done = p.then(() => { settled = true; }, () => { settled = true; });
    while (!settled) {
      if (c.jobPausePending) await this.atBoundary();
      else await Promise.race([done, c.nextChange()]);
    }
  }

  /** Server role: serves until the driver ends the job (or `close`). */
  async serve(): Promise<void> {
    const transport = this.need(this.transport, 'transport');
    await new Promise<void>((resolveServe) => {
      const sub = transport.subscribe(controlSubject(this.config.job.name, 'shutdown'), (m) => {
        try { decode(m.data); } catch { /* any shutdown message counts */ }
        sub.unsubscribe();
        resolveServe();
      });
      const check = setInterval(() => { if (this.closed) { clearInterval(check); sub.unsubscribe(); resolveServe(); } }, 200);
      check.unref();
    });
  }

  async close(): Promise<void> {
    if (this.closed || this.closing) return;
    this.closing = true;
    // A group member takes part in the group's windows until the group agrees the job is done.
    if (this.windows !== null) await this.windows.finish().catch((e: unknown) => this.log.error({ err: e }, 'group windows failed'));
    this.closed = true;
    this.control?.close();
    this.health?.dispose();
    this.profile?.stop();
    await Promise.all(this.pendingCheckpoints);
    if (this.workerNode && this.transport && this.info) {
      publishTelemetry(this.transport, this.info.job, 'done', this.node, {
        node: this.node, steps: this.stats.steps, samples: this.stats.samples, batches_acked: this.stats.acked, empty_rounds: 0, reason: 'done',
      });
    }
    await this.queue?.close();
    await this.system?.stop().catch(() => undefined);
    await this.heartbeat?.stop(true);
    await this.session?.dispose().catch(() => undefined);
    await this.transport?.close().catch(() => undefined);
  }

  private need<T>(v: T | null, what: string): T {
    if (v === null) throw new ConfigError(`HeterogeneousParameterServer: call init() first (${what} is not ready)`);
    return v;
  }
}
