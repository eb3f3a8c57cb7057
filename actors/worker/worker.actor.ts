/**
 * The worker actor: one per worker node. Its training loop runs as a task
 * the actor starts; the actor itself answers `stats` and `stop`.
 *
 * Per step: take a batch descriptor from the work queue when ready (a fast
 * worker takes more), regenerate the batch, pull what it needs from the
 * shards, run the step graph, push the gradients to every owning shard, and
 * acknowledge the batch only once every push is accepted — a batch whose
 * worker dies is delivered again after ack_wait.
 *
 * Modes (training.mode):
 * - `asp`: free-running; the loop ends when every batch of the job is acknowledged.
 * - `bsp`: every worker takes part in every round r = 0..R-1: it pulls with
 *   `min_round r` (answered once round r-1 is applied everywhere), pushes a
 *   contribution to round r weighted by its batch size — 0 when it found no
 *   batch, so the round still completes.
 * - `hps`: hierarchical sync is not active yet; runs as `asp` and says so.
 */
import {
  type ActorContext, type ActorDefinition, type Timer,
} from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import { StepSession, type CtrModel, type DataSource, type ExecutionProvider, type MlpModel } from '../../native-bridge/mod.ts';
import type { BatchQueue, QueuedBatch } from '../batch-queue.ts';
import type { SparseLayout } from '../config-bridge.ts';
import type { JobInfo } from '../job-info.ts';
import { publishTelemetry, type BatchTelemetry, type DoneTelemetry, type ProgressTelemetry } from '../telemetry.ts';
import { ShardClient, StopRequestedError } from './shard-client.ts';
import { WorkerStepper, batchFromDescriptor, type SyncRound } from './step.ts';
import { workerMessages, type WorkerMessages, type WorkerStats } from './worker.messages.ts';

export interface WorkerActorOptions {
  node: string;
  group: string;
  job: JobInfo;
  plan: ShardPlan;
  queue: BatchQueue;
  source: DataSource;
  model: CtrModel | MlpModel;
  layout: SparseLayout;
  provider: ExecutionProvider;
  /** ONNX Runtime threads per operator; null = every CPU. */
  threads: number | null;
  emulateSpeed: number | null;
  /** Per request attempt to a shard. Default 10 s. */
  requestTimeoutMs?: number;
  /** How long a bsp worker looks for a batch before it contributes an empty one. Default 1.5 s. */
  bspBatchWaitMs?: number;
  /** Default 2 s. */
  progressIntervalMs?: number;
}

export type WorkerActorDefinition = ActorDefinition<WorkerMessages> & {
  /** Resolves with the final stats when the training loop has ended (done, stopped or failed). */
  readonly done: Promise<WorkerStats>;
  /** Stats now. */
  stats(): WorkerStats;
};

export function createWorkerActor(o: WorkerActorOptions): WorkerActorDefinition {
  const mode: 'bsp' | 'asp' = o.job.mode === 'bsp' ? 'bsp' : 'asp';
  const requestTimeoutMs = o.requestTimeoutMs ?? 10_000;
  const stats: WorkerStats = {
    node: o.node, group: o.group, state: 'starting', mode, steps: 0, samples: 0, batches_acked: 0, ack_failures: 0,
    redelivered_taken: 0, empty_rounds: 0, round: null, mean_loss: null, emulated_speed: o.emulateSpeed, error: null,
  };
  let stopRequested = false;
  let session: StepSession | null = null;
  let loop: Promise<void> | null = null;
  let resolveDone!: (s: WorkerStats) => void;
  const done = new Promise<WorkerStats>((r) => { resolveDone = r; });
  // Loss and samples since the last progress message.
  let windowLoss = 0; let windowSamples = 0; let windowSteps = 0; let windowStart = 0;
  let lossSum = 0;

  const run = async (ctx: ActorContext): Promise<void> => {
    const { log, clock, system } = ctx;
    const client = new ShardClient(system, { requestTimeoutMs, log, shouldStop: () => stopRequested });
    const stepper = new WorkerStepper({ client, plan: o.plan, model: o.model, layout: o.layout, session: session!, clock, log, emulateSpeed: o.emulateSpeed });
    const job = o.job.job;
    if (o.job.mode === 'hps') {
      log.warn('training.mode hps: hierarchical sync (sync inside groups, async between them) is not active yet; this worker trains asynchronously (asp)');
    }
    if (o.emulateSpeed !== null) log.info({ emulated_speed: o.emulateSpeed }, `emulated heterogeneity: compute time stretched ×${(1 / o.emulateSpeed).toFixed(2)} (nodes.${o.node}.emulate.speed)`);
    windowStart = clock.monotonic();
    publishTelemetry(system.transport, job, 'start', o.node, { node: o.node, group: o.group, mode, emulated_speed: o.emulateSpeed });
    const progress = clock.setInterval(() => {
      const now = clock.monotonic();
      const body: ProgressTelemetry = {
        node: o.node, group: o.group, steps: stats.steps, samples: stats.samples,
        loss: windowSamples > 0 ? windowLoss / windowSamples : null,
        samples_per_s: now > windowStart ? (windowSamples * 1000) / (now - windowStart) : 0,
        round: stats.round, emulated_speed: o.emulateSpeed,
      };
      publishTelemetry(system.transport, job, 'progress', o.node, body);
      windowLoss = 0; windowSamples = 0; windowSteps = 0; windowStart = now;
    }, o.progressIntervalMs ?? 2_000);

    const step = async (item: QueuedBatch | null, sync: SyncRound | null): Promise<void> => {
      // A long bsp wait must not let the batch's ack_wait run out while this worker still holds it.
      let keepAlive: Timer | null = null;
      if (item !== null) {
        if (item.redelivered) stats.redelivered_taken++;
        keepAlive = clock.setInterval(() => item.working(), Math.max(500, Math.floor(o.job.ack_wait_ms / 3)));
      }
      try {
        const batch = item === null ? null : batchFromDescriptor(o.source, item.desc);
        const out = await stepper.run(batch, sync);
        keepAlive?.cancel();
        if (item === null || out.loss === null) { stats.empty_rounds++; return; }
        const confirmed = await item.ack();
        stats.steps++; stats.samples += out.samples;
        windowSteps++; windowSamples += out.samples; windowLoss += out.loss * out.samples; lossSum += out.loss * out.samples;
        stats.mean_loss = lossSum / stats.samples;
        if (confirmed) stats.batches_acked++;
        else {
          stats.ack_failures++;
          log.warn({ batch: item.desc.batch_id }, 'the queue did not confirm the acknowledgement (the delivery had expired): the batch may be trained again');
        }
        const tel: BatchTelemetry = {
          node: o.node, batch_id: item.desc.batch_id, samples: out.samples, loss: out.loss, redelivered: item.redelivered,
          ack_confirmed: confirmed, staleness: out.staleness, round: sync?.round ?? null,
        };
        publishTelemetry(system.transport, job, 'batch', o.node, tel);
      } catch (e) {
        keepAlive?.cancel();
        // Give the batch back at once rather than after ack_wait.
        item?.nak();
        throw e;
      }
    };

    try {
      stats.state = 'training';
      if (mode === 'bsp') {
        const expected = o.job.workers.length;
        for (let r = 0; r < o.job.rounds && !stopRequested; r++) {
          stats.round = r;
          const item = await o.queue.next(o.bspBatchWaitMs ?? 1_500);
          await step(item, { round: r, expected });
        }
      } else {
        while (!stopRequested) {
          const item = await o.queue.next(1_000);
          if (item === null) {
            // Empty for now: done once nothing is in flight anywhere (a dead worker's batch comes back after ack_wait).
            if ((await o.queue.pending().catch(() => 1)) === 0) break;
            continue;
          }
          await step(item, null);
        }
      }
      stats.state = stopRequested ? 'stopped' : 'done';
    } catch (e) {
      if (e instanceof StopRequestedError) stats.state = 'stopped';
      else {
        stats.state = 'failed';
        stats.error = (e as Error).message;
        log.error({ err: e }, 'training loop failed');
      }
    } finally {
      progress.cancel();
      const body: DoneTelemetry = {
        node: o.node, steps: stats.steps, samples: stats.samples, batches_acked: stats.batches_acked, empty_rounds: stats.empty_rounds, reason: stats.state,
      };
      publishTelemetry(system.transport, job, 'done', o.node, body);
      log.info({ steps: stats.steps, samples: stats.samples, acked: stats.batches_acked, state: stats.state }, 'training loop ended');
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
      stopRequested = true;
      await loop;
      await session?.dispose();
      session = null;
    },
    handlers: {
      stats: () => ({ ...stats }),
      stop: (m, ctx) => {
        if (!stopRequested) ctx.log.info({ reason: m.reason }, 'stop requested');
        stopRequested = true;
        return { stopping: true, state: stats.state };
      },
    },
  };
}
