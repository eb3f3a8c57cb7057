/**
 * The driver's side of a run (`hetps up`): create the job — shard plan,
 * batch descriptors of every epoch, job info, in that order — then follow
 * training through the workers' telemetry until every batch is acknowledged,
 * keeping the exactly-once accounting (each batch id acknowledged once).
 * Transport-neutral: the same code drives a NATS job and an embedded one.
 */
import { HetpsError, type Clock, type Logger, type Transport } from '../runtime/mod.ts';
import { allWorkerNodes, type HetpsConfig, type ShardPlan } from '../topology/mod.ts';
import { ackWaitFromConfig, type BatchDescriptor, type BatchQueue } from './batch-queue.ts';
import { batchDescriptors, shardPlanFromConfig } from './config-bridge.ts';
import type { JobInfo, JobInfoStore } from './job-info.ts';
import type { ModelAndData } from './nodes.ts';
import type { PlanStore } from './plan-store.ts';
import { subscribeTelemetry } from './telemetry.ts';

export interface PreparedJob {
  plan: ShardPlan;
  descriptors: BatchDescriptor[];
  info: JobInfo;
}

/** Plan first, then every batch, then the job info: a worker that sees the info finds all batches queued. */
export async function prepareJob(o: {
  config: HetpsConfig; runId: string; maxPayload: number; md: ModelAndData; planStore: PlanStore; jobStore: JobInfoStore; queue: BatchQueue;
  ackWaitMs?: number;
}): Promise<PreparedJob> {
  const { config } = o;
  let plan = shardPlanFromConfig(config, o.md.model, o.maxPayload);
  // A job name reused on a long-running NATS keeps its old plan: plans only move forward, so a different one gets the next version.
  const existing = await o.planStore.get().catch(() => null);
  if (existing !== null && (existing.version >= plan.version)) {
    const same = JSON.stringify({ ...existing, version: 0 }) === JSON.stringify({ ...plan, version: 0 });
    plan = shardPlanFromConfig(config, o.md.model, o.maxPayload, same ? existing.version : existing.version + 1);
  }
  await o.planStore.put(plan);
  const descriptors = batchDescriptors(config, o.md.source);
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
    ack_wait_ms: o.ackWaitMs ?? ackWaitFromConfig(config.fault_tolerance.worker_recovery_timeout),
  };
  await o.jobStore.put(info);
  return { plan, descriptors, info };
}

export interface TrainingProgress {
  samples: number;
  total_samples: number;
  batches_acked: number;
  total_batches: number;
  samples_per_s: number;
  /** Sample-weighted mean loss of the batches acknowledged since the previous report; null if none. */
  loss: number | null;
  elapsed_s: number;
  /** Per worker: batches acknowledged, for the "fast workers take more" view. */
  per_worker: Record<string, number>;
}

export interface TrainingReport {
  samples: number;
  batches: number;
  /** Distinct batch ids acknowledged (confirmed by the queue). */
  batches_acked: number;
  /** Confirmed acknowledgements beyond the first, per batch id, summed. */
  duplicate_acks: number;
  /** Acknowledgements the queue did not confirm (expired deliveries). */
  unconfirmed_acks: number;
  redelivered: number;
  train_s: number;
  samples_per_s: number;
  /** Sample-weighted mean loss over the last 10% of acknowledged batches. */
  final_loss: number | null;
  per_worker: Record<string, number>;
  /** Batch ids never acknowledged (empty on success). */
  missing: string[];
}

export interface SuperviseOptions {
  queue: BatchQueue;
  prepared: PreparedJob;
  onProgress: (p: TrainingProgress) => void;
  progressEveryMs?: number;
  /** Called every poll; a string aborts the run with that reason (e.g. every worker process has exited). */
  check?: () => string | null;
  /** After the queue is empty, how long to wait for the last batch telemetry. Default 5 s. */
  telemetryGraceMs?: number;
  /** Warn when no batch was acknowledged for this long. Default 30 s. */
  stallWarnMs?: number;
}

/**
 * The workers' telemetry, from before the job is created (nodes may already
 * be waiting for it) until training ends. `supervise` follows training until
 * the queue holds no unacknowledged batch and throws when `check` reports a
 * dead end.
 */
export class TrainingMonitor {
  private readonly acks = new Map<string, number>();
  private readonly batchTelemetry: { id: string; node: string; samples: number; loss: number }[] = [];
  private readonly perWorker: Record<string, number> = {};
  private readonly done = new Map<string, string>();
  /** When the first worker loop started and the last batch was acknowledged (monotonic ms), for the throughput. */
  private firstStart: number | null = null;
  private lastAck: number | null = null;
  private unconfirmed = 0;
  private redelivered = 0;
  private readonly unsubscribe: () => void;

  /** Last telemetry of any kind per worker (monotonic ms): a liveness hint until heartbeats exist. */
  private readonly lastSeen = new Map<string, number>();

  constructor(transport: Transport, job: string, private readonly clock: Clock, private readonly log: Logger) {
    const seen = (node: string) => { this.lastSeen.set(node, this.clock.monotonic()); };
    this.unsubscribe = subscribeTelemetry(transport, job, {
      progress: (t) => seen(t.node),
      batch: (t) => {
        seen(t.node);
        if (t.redelivered) this.redelivered++;
        if (!t.ack_confirmed) { this.unconfirmed++; return; }
        const n = (this.acks.get(t.batch_id) ?? 0) + 1;
        this.acks.set(t.batch_id, n);
        this.perWorker[t.node] = (this.perWorker[t.node] ?? 0) + 1;
        if (n > 1) { this.log.warn({ batch: t.batch_id, node: t.node, times: n }, 'batch acknowledged more than once'); return; }
        this.batchTelemetry.push({ id: t.batch_id, node: t.node, samples: t.samples, loss: t.loss });
        this.lastAck = this.clock.monotonic();
      },
      start: (t) => { seen(t.node); this.firstStart ??= this.clock.monotonic(); },
      done: (t) => { seen(t.node); this.done.set(t.node, t.reason); },
    });
  }

  dispose(): void { this.unsubscribe(); }

  /**
   * After training: waits until every worker that started has ended its loop
   * (a script may still save a checkpoint from the shards) or has been silent
   * for `silenceMs` (it died), at most `timeoutMs`. Returns the workers given up on.
   */
  async waitForWorkers(opts: { timeoutMs: number; silenceMs: number }): Promise<string[]> {
    const start = this.clock.monotonic();
    for (;;) {
      const now = this.clock.monotonic();
      const open = [...this.lastSeen.keys()].filter((w) => !this.done.has(w));
      const alive = open.filter((w) => now - this.lastSeen.get(w)! < opts.silenceMs);
      if (alive.length === 0) return open;
      if (now - start >= opts.timeoutMs) {
        this.log.warn({ workers: alive }, `workers still running ${Math.round(opts.timeoutMs / 1000)} s after training ended: ${alive.join(', ')}`);
        return open;
      }
      await this.clock.sleep(100);
    }
  }

  async supervise(o: SuperviseOptions): Promise<TrainingReport> {
    const { clock, log } = this;
    const { prepared } = o;
    const total = prepared.descriptors.length;
    const samplesOf = new Map(prepared.descriptors.map((d) => [d.batch_id, d.samples]));
    const totalSamples = prepared.descriptors.reduce((n, d) => n + d.samples, 0);
    const start = clock.monotonic();
    let lastAckAt = start;
    let seen = 0;
    let samples = 0;
    let windowLoss = 0; let windowSamples = 0;
    const absorb = () => {
      for (; seen < this.batchTelemetry.length; seen++) {
        const t = this.batchTelemetry[seen]!;
        const s = samplesOf.get(t.id) ?? t.samples;
        samples += s;
        windowLoss += t.loss * s; windowSamples += s;
        lastAckAt = clock.monotonic();
      }
    };
    const report = (): TrainingProgress => {
      absorb();
      const elapsed = (clock.monotonic() - (this.firstStart ?? clock.monotonic())) / 1000;
      const p: TrainingProgress = {
        samples, total_samples: totalSamples, batches_acked: this.acks.size, total_batches: total,
        samples_per_s: elapsed > 0 ? samples / elapsed : 0, loss: windowSamples > 0 ? windowLoss / windowSamples : null,
        elapsed_s: elapsed, per_worker: { ...this.perWorker },
      };
      windowLoss = 0; windowSamples = 0;
      return p;
    };

    let lastProgress = start;
    let lastStallNote = start;
    let emptySince: number | null = null;
    const stallWarnMs = o.stallWarnMs ?? 30_000;
    for (;;) {
      await clock.sleep(250);
      absorb();
      const now = clock.monotonic();
      if (now - lastProgress >= (o.progressEveryMs ?? 1_000)) { lastProgress = now; o.onProgress(report()); }
      const reason = o.check?.() ?? null;
      if (reason !== null) throw new HetpsError(`training cannot finish: ${reason} (${this.acks.size}/${total} batches acknowledged)`);
      const pending = await o.queue.pending().catch((e: unknown) => { log.warn({ err: (e as Error).message }, 'cannot read the queue'); return -1; });
      if (pending === 0) {
        emptySince ??= now;
        // The queue is the ground truth; telemetry may trail it by a moment.
        if (this.acks.size >= total || now - emptySince >= (o.telemetryGraceMs ?? 5_000)) break;
      } else {
        emptySince = null;
      }
      const workers = prepared.info.workers;
      if (pending > 0 && workers.every((w) => this.done.has(w))) {
        const reasons = workers.map((w) => `${w}: ${this.done.get(w)}`).join(', ');
        throw new HetpsError(`every worker's training loop has ended (${reasons}) but ${pending} batch(es) are still unacknowledged`);
      }
      if (now - lastAckAt >= stallWarnMs && now - lastStallNote >= stallWarnMs) {
        lastStallNote = now;
        const running = workers.filter((w) => !this.done.has(w));
        log.warn({ pending, acked: this.acks.size, total, workers_running: running },
          `no batch acknowledged for ${Math.round((now - lastAckAt) / 1000)} s: ${pending} unacknowledged batch(es); workers still running: ${running.join(', ') || 'none'}`
          + (prepared.info.mode === 'bsp' ? ' (bsp waits for every worker each round)' : ''));
      }
    }
    o.onProgress(report());
    // Training time: from the first worker loop to the last acknowledgement (node start-up is not training).
    const trainS = this.firstStart !== null && this.lastAck !== null ? Math.max(0, this.lastAck - this.firstStart) / 1000 : (clock.monotonic() - start) / 1000;
    let duplicate = 0;
    for (const n of this.acks.values()) duplicate += n - 1;
    const tail = this.batchTelemetry.slice(Math.floor(this.batchTelemetry.length * 0.9));
    let tl = 0; let ts = 0;
    for (const t of tail) { const s = samplesOf.get(t.id) ?? t.samples; tl += t.loss * s; ts += s; }
    return {
      samples, batches: total, batches_acked: this.acks.size, duplicate_acks: duplicate, unconfirmed_acks: this.unconfirmed, redelivered: this.redelivered,
      train_s: trainS, samples_per_s: trainS > 0 ? samples / trainS : 0, final_loss: ts > 0 ? tl / ts : null,
      per_worker: { ...this.perWorker }, missing: prepared.descriptors.filter((d) => !this.acks.has(d.batch_id)).map((d) => d.batch_id),
    };
  }
}
