/**
 * The worker actor: one per worker node. Its training loop runs as a task
 * the actor starts; the actor itself answers `stats`, `stop`, `pause` and
 * `resume` (worker.messages.ts, with the loop's lifecycle states).
 *
 * Per step: take a batch descriptor from the work queue when ready (a fast
 * worker takes more), regenerate the batch, pull what it needs from the
 * shards, run the step graph, push the gradients to every owning shard, and
 * acknowledge the batch only once every push is accepted — a batch whose
 * worker dies is delivered again after ack_wait.
 *
 * One loop per mode (training.mode), over what they share (worker-loop.ts)
 * and what steers them (loop-control.ts: stop, pause, the job-wide pause):
 * - `asp` (asp-loop.ts): free-running; ends when every batch of the job is acknowledged.
 * - `bsp` (bsp-loop.ts): every worker takes part in every synchronous round.
 * - `hps` (hps-loop.ts): synchronous inside the worker's group, asynchronous
 *   between groups, in sync windows of the group's strategy.
 *
 * Emulation (`nodes.<name>.emulate`) is labelled in the logs, the stats and
 * every telemetry message (`emulated`, `emulated_speed`).
 */
import { ConfigError, type ActorContext, type ActorDefinition } from '../../runtime/mod.ts';
import type { GradientCompressionMode, GroupLrRule, ShardPlan, WorkerGroupConfig } from '../../topology/mod.ts';
import { StepSession, type CtrModel, type DataSource, type ExecutionProvider, type MlpModel } from '../../native-bridge/mod.ts';
import type { BatchQueue } from '../store/batch-queue.ts';
import type { SparseLayout } from '../node/config-bridge.ts';
import type { JobInfo, JobInfoStore } from '../store/job-info.ts';
import type { HealthView } from '../health/health.types.ts';
import { publishTelemetry, type BatchTelemetry, type DoneTelemetry, type StartTelemetry } from '../monitor/telemetry.ts';
import type { PlanStore } from '../store/plan-store.ts';
import { PlanView } from '../store/plan-view.ts';
import { ShardClient, StopRequestedError } from './shard-client.ts';
import { WorkerStepper } from './step.ts';
import type { LocalOptimizers } from './local-updates.ts';
import { LoopControl, startVersion } from './loop-control.ts';
import { TrainingLedger, type WorkerLoopEnv } from './worker-loop.ts';
import { runAspLoop } from './asp-loop.ts';
import { runBspLoop } from './bsp-loop.ts';
import { HpsLoop } from './hps-loop.ts';
import { TailGate } from './tail-gate.ts';
import {
  workerMessages, type PauseReply, type ResumeReply, type StopReply, type WorkerMessages, type WorkerStats,
} from './worker.messages.ts';

export interface WorkerActorOptions {
  node: string;
  group: string;
  job: JobInfo;
  plan: ShardPlan;
  /** Where newer plans (failovers) come from; null or absent: the client routes by \`plan\` only. */
  planStore?: PlanStore | null;
  queue: BatchQueue;
  source: DataSource;
  model: CtrModel | MlpModel;
  layout: SparseLayout;
  provider: ExecutionProvider;
  /** ONNX Runtime threads per operator; null = every CPU. */
  threads: number | null;
  emulateSpeed: number | null;
  /** training.emulation_reference_step_ms (default 100). */
  referenceStepMs?: number;
  /** nodes.<name>.emulate.bandwidth_mbps; null or absent: not limited. */
  bandwidthMbps?: number | null;
  /** The bandwidth of the worker's link to NATS as its profile measured it (adaptive compression reads it); null or absent: not measured. */
  measuredBandwidthMbps?: number | null;
  /** hps: this worker's group (members, sync strategy); required in hps, ignored otherwise. */
  groupSync?: WorkerGroupConfig | null;
  /** hps: the learning-rate rule for the group's updates (training.group_lr_scaling); null or absent: none. */
  groupLr?: GroupLrRule | null;
  /** hps: training.stream_slices (each step's slices sent as it completes; the config's default is true); absent: false. */
  streamSlices?: boolean;
  /** hps: training.group_update is `direct` (each member pushes its own window; the group only keeps the rounds); absent: false. */
  directPush?: boolean;
  /** hps: training.local_updates' optimizers (local-updates.ts); null or absent: none. */
  localOptimizers?: LocalOptimizers | null;
  /**
   * communication.compression: fp16, gradients go out as scaled halves;
   * adaptive, so while the link's utilisation is above compressionThreshold;
   * null or absent: float32.
   */
  compression?: GradientCompressionMode;
  /** communication.compression_threshold (adaptive); default 0.5. */
  compressionThreshold?: number;
  /** communication.compress_pulls: training pulls as scaled halves while gradients go as fp16; default false. */
  compressPulls?: boolean;
  /** Per request attempt to a shard. Default 10 s. */
  requestTimeoutMs?: number;
  /** How long a bsp worker looks for a batch before it contributes an empty one. Default 1.5 s. */
  bspBatchWaitMs?: number;
  /** Default 2 s. */
  progressIntervalMs?: number;
  /**
   * The job info store, watched for the driver's job-wide pause (a newer
   * groups_version; in hps also a regroup) and resume (resume_version);
   * null or absent: no job-wide pause reaches this worker (hps: it keeps its
   * group for the whole run).
   */
  jobStore?: JobInfoStore | null;
  /** How long a paused worker waits for the driver's resume before it fails. Default 120 s. */
  regroupResumeTimeoutMs?: number;
  /** Called with each acknowledged batch's telemetry (the node's profile reporter keeps its step times). */
  onBatchTrained?: ((t: BatchTelemetry) => void) | null;
  /** hps: the health actor's verdicts, handed to each group member (see GroupMemberOptions.health); null or absent: none. */
  health?: HealthView | null;
  /** asp and hps: training.tail_dispatch (tail-gate.ts); absent: false. */
  tailDispatch?: boolean;
}

export type WorkerActorDefinition = ActorDefinition<WorkerMessages> & {
  /** Resolves with the final stats when the training loop has ended (done, stopped or failed). */
  readonly done: Promise<WorkerStats>;
  /** Stats now. */
  stats(): WorkerStats;
};

export function createWorkerActor(o: WorkerActorOptions): WorkerActorDefinition {
  const mode = o.job.mode;
  const groupSync = mode === 'hps' ? o.groupSync ?? null : null;
  if (mode === 'hps' && groupSync === null) throw new ConfigError(`worker ${o.node}: training.mode hps needs the worker's group (groupSync)`);
  const emulated = o.emulateSpeed !== null || (o.bandwidthMbps ?? null) !== null;
  const requestTimeoutMs = o.requestTimeoutMs ?? 10_000;
  const stats: WorkerStats = {
    node: o.node, group: o.group, state: 'starting', mode, sync_mode: groupSync?.sync_mode ?? null, windows: 0, group_state: null, lost_shard_updates: 0,
    window_phases_ms: groupSync !== null ? { steps: 0, inputs: 0, slices: 0, round: 0, gather: 0, push: 0, reports: 0 } : null, dropped_stale_batches: 0, part_dropped_batches: 0,
    busy_ms: 0, emulated_step_ms: 0, steps: 0, samples: 0, batches_acked: 0, ack_failures: 0,
    redelivered_taken: 0, empty_rounds: 0, tail_declined: 0, round: null, mean_loss: null, emulated_speed: o.emulateSpeed, emulated, error: null,
  };
  const control = new LoopControl({
    // A worker that starts while the job is paused (or regrouping) starts under the version training runs under, so it pauses too.
    node: o.node, runId: o.job.run_id, groupsVersion: startVersion(o.job), store: o.jobStore ?? null,
    resumeTimeoutMs: o.regroupResumeTimeoutMs ?? 120_000, stats,
  });
  let session: StepSession | null = null;
  let loop: Promise<void> | null = null;
  let resolveDone!: (s: WorkerStats) => void;
  const done = new Promise<WorkerStats>((r) => { resolveDone = r; });

  const run = async (ctx: ActorContext): Promise<void> => {
    const { log, clock, system } = ctx;
    const job = o.job.job;
    const client = new ShardClient(system, {
      requestTimeoutMs, log, shouldStop: () => control.stopRequested,
      plans: o.planStore ? PlanView.follow(o.plan, o.planStore) : o.plan,
    });
    const stepper = new WorkerStepper({
      client, plan: o.plan, model: o.model, layout: o.layout, session: session!, clock, log, node: o.node,
      emulateSpeed: o.emulateSpeed, referenceStepMs: o.referenceStepMs, bandwidthMbps: o.bandwidthMbps ?? null, measuredBandwidthMbps: o.measuredBandwidthMbps ?? null,
      localOptimizers: groupSync !== null ? o.localOptimizers ?? null : null,
      compression: o.compression ?? null, compressionThreshold: o.compressionThreshold, compressPulls: o.compressPulls ?? false,
    });
    if (o.emulateSpeed !== null) {
      log.info({ emulated_speed: o.emulateSpeed, emulated_step_ms: stepper.pacer.targetStepMs },
        `EMULATED heterogeneity (not real hardware): every step takes ${stepper.pacer.targetStepMs!.toFixed(0)} ms `
        + `(training.emulation_reference_step_ms / nodes.${o.node}.emulate.speed ${o.emulateSpeed}), the real compute inside it`);
    }
    if ((o.bandwidthMbps ?? null) !== null) log.info({ bandwidth_mbps: o.bandwidthMbps }, `EMULATED link: ${o.bandwidthMbps} Mbit/s for pulls, pushes and group slices (nodes.${o.node}.emulate.bandwidth_mbps)`);
    if (o.compression === 'adaptive') {
      const measure = stepper.linkUsage.measure;
      log.info({ compression_threshold: stepper.compressionThreshold, measured_by: measure }, measure === 'none (embedded bus, no link)'
        ? `adaptive compression: on the embedded bus without nodes.${o.node}.emulate.bandwidth_mbps there is no link to measure; gradients are sent as float32`
        : `adaptive compression: gradients are sent as fp16 while link utilisation (${measure}, last 10 s) is above ${stepper.compressionThreshold}`);
    }
    if (groupSync !== null) {
      log.info({ group: groupSync.name, sync_mode: groupSync.sync_mode, members: groupSync.nodes },
        `hps: ${groupSync.sync_mode} inside group ${groupSync.name} (${groupSync.nodes.join(', ')}), asynchronous between groups`);
    }
    let hps: HpsLoop | null = null;
    const ledger = new TrainingLedger({
      node: o.node, group: o.group, batchGroup: () => hps?.groupName ?? null, stats, transport: system.transport, job, clock, log,
      emulateSpeed: o.emulateSpeed, emulated, ackWaitMs: o.job.ack_wait_ms, onBatchTrained: o.onBatchTrained ?? null,
      firstStepAt: () => stepper.firstStepAt,
      compression: () => ({ choice: stepper.compressionChoice, linkUtilisation: stepper.linkUtilisation }),
    });
    const progressMs = o.progressIntervalMs ?? 2_000;
    // Rates over the last ten progress reports, counted once a worker has sent three.
    const tail = o.tailDispatch === true && mode !== 'bsp'
      ? new TailGate({ transport: system.transport, job, node: o.node, queue: o.queue, clock, log, windowMs: 10 * progressMs, minSpanMs: 3 * progressMs,
        samplesPerBatch: () => (stats.steps > 0 ? stats.samples / stats.steps : null), onDeclined: (n) => { stats.tail_declined = n; } })
      : null;
    const env: WorkerLoopEnv = { o, stats, control, ledger, stepper, system, clock, log, requestTimeoutMs, tail };
    if (groupSync !== null) hps = new HpsLoop(env, groupSync);
    const start: StartTelemetry = {
      node: o.node, group: o.group, mode, emulated_speed: o.emulateSpeed, emulated, sync_mode: groupSync?.sync_mode ?? null,
      emulated_step_target_ms: stepper.pacer.targetStepMs,
    };
    tail?.start();
    ledger.start(progressMs);
    publishTelemetry(system.transport, job, 'start', o.node, start);
    try {
      await control.start({ transport: system.transport, job, clock, log });
      if (hps !== null) await hps.run();
      else if (mode === 'bsp') await runBspLoop(env);
      else await runAspLoop(env);
      control.end(control.stopRequested ? 'stopped' : 'done');
    } catch (e) {
      if (e instanceof StopRequestedError) control.end('stopped');
      else {
        control.end('failed');
        stats.error = (e as Error).message;
        log.error({ err: e }, 'training loop failed');
      }
    } finally {
      control.close();
      ledger.stop();
      tail?.stop();
      // A step left running by a window dropped for a pause ends before the session is disposed.
      await stepper.idle();
      const body: DoneTelemetry = {
        node: o.node, steps: stats.steps, samples: stats.samples, batches_acked: stats.batches_acked, empty_rounds: stats.empty_rounds, reason: stats.state,
        busy_ms: stats.busy_ms, emulated_step_ms: stats.emulated_step_ms, wall_ms: Math.max(0, clock.monotonic() - ledger.startedAt),
        emulated, emulated_speed: o.emulateSpeed, dropped_stale_batches: stats.dropped_stale_batches, part_dropped_batches: stats.part_dropped_batches, windows: stats.windows, tail_declined: stats.tail_declined,
        window_phases_ms: stats.window_phases_ms === null ? null : { ...stats.window_phases_ms },
      };
      publishTelemetry(system.transport, job, 'done', o.node, body);
      log.info({
        steps: stats.steps, samples: stats.samples, acked: stats.batches_acked, state: stats.state,
        ...(groupSync !== null ? { windows: stats.windows, dropped_stale_batches: stats.dropped_stale_batches } : {}),
        ...(emulated ? { emulated: true, emulated_speed: o.emulateSpeed } : {}),
      }, 'training loop ended');
      resolveDone({ ...stats });
    }
  };

  return {
    kind: 'worker',
    id: o.node,
    messages: workerMessages,
    done,
    stats: () => ({ ...stats }),
    async onStart(ctx) {
      session = await StepSession.create(o.model, { provider: o.provider, intraOpNumThreads: o.threads, graph: 'step' });
      loop = run(ctx);
    },
    async onStop() {
      control.requestStop();
      await loop;
      await session?.dispose();
      session = null;
    },
    handlers: {
      stats: () => ({ ...stats }),
      stop: (m, ctx): StopReply => {
        if (control.requestStop()) ctx.log.info({ reason: m.reason }, 'stop requested');
        return { stopping: true, state: stats.state };
      },
      pause: (m, ctx): PauseReply => {
        const pausing = control.requestPause();
        if (pausing) ctx.log.info({ reason: m.reason }, 'pause requested: pausing at the next step boundary');
        return { pausing, state: stats.state };
      },
      resume: (m, ctx): ResumeReply => {
        const resumed = control.requestResume();
        if (resumed) ctx.log.info({ reason: m.reason }, 'resume requested');
        return { resumed, state: stats.state };
      },
    },
  };
}
