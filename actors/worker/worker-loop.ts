/**
 * What every mode's training loop shares: the ledger of trained batches (the
 * counters, the `batch` telemetry once a batch is acknowledged, the periodic
 * `progress` telemetry), keeping held batches alive, and the asp / bsp step
 * on a batch from the queue. The modes' loops (asp-loop.ts, bsp-loop.ts,
 * hps-loop.ts) get all of it as one `WorkerLoopEnv`.
 */
import type { ActorSystem, Clock, Logger, Timer, Transport } from '../../runtime/mod.ts';
import type { CompressionChoice } from '../../topology/mod.ts';
import type { QueuedBatch } from '../store/batch-queue.ts';
import { PROGRESS_HELD_IDS, publishTelemetry, type BatchTelemetry, type ProgressTelemetry } from '../monitor/telemetry.ts';
import type { LoopControl } from './loop-control.ts';
import type { TailGate } from './tail-gate.ts';
import { batchFromDescriptor, type SyncRound, type WorkerStepper } from './step.ts';
import type { WorkerActorOptions } from './worker.actor.ts';
import type { WorkerStats } from './worker.messages.ts';

/** What a mode's loop works with. */
export interface WorkerLoopEnv {
  o: WorkerActorOptions;
  stats: WorkerStats;
  control: LoopControl;
  ledger: TrainingLedger;
  stepper: WorkerStepper;
  system: ActorSystem;
  clock: Clock;
  log: Logger;
  requestTimeoutMs: number;
  /** training.tail_dispatch (asp, hps): asked before each batch is taken; null: every batch is taken. */
  tail: TailGate | null;
}

/** One trained batch, as the ledger counts it. */
export interface TrainedBatch {
  loss: number;
  samples: number;
  computeMs: number;
  stepMs: number;
  staleness: number;
  droppedStale: boolean;
  /** The update was applied without its dense blocks or its rows somewhere (training.max_staleness { dense, sparse }). */
  partDropped: boolean;
  round: number | null;
  window: number | null;
}

export interface TrainingLedgerOptions {
  node: string;
  /** The group progress telemetry names (the worker's group when it started). */
  group: string;
  /** hps: the group a batch is trained in now (it changes on regroup); null in asp / bsp. */
  batchGroup: () => string | null;
  stats: WorkerStats;
  transport: Transport;
  job: string;
  clock: Clock;
  log: Logger;
  emulateSpeed: number | null;
  emulated: boolean;
  ackWaitMs: number;
  /** When (clock.monotonic) the worker's first step began; null before it (progress telemetry: first_step_ago_ms). */
  firstStepAt?: () => number | null;
  onBatchTrained: ((t: BatchTelemetry) => void) | null;
  /** How the worker's gradients leave it now and its link utilisation (progress telemetry); absent: not reported. */
  compression?: () => { choice: CompressionChoice; linkUtilisation: number | null };
}

const firstStepAgo = (at: number | null, now: number): number | null => (at === null ? null : Math.max(0, now - at));

export class TrainingLedger {
  /** Loss, samples and time since the last progress message. */
  private since = { loss: 0, samples: 0, start: 0, busy: 0, stepMs: 0 };
  private lossSum = 0;
  private progress: Timer | null = null;
  /** When the loop started (monotonic ms). */
  startedAt = 0;
  /** What each `keepAlive` in force holds: the batches this worker has taken and not yet acknowledged or given back. */
  private readonly holders = new Set<() => Iterable<QueuedBatch | null>>();
  /** When this worker last acknowledged a trained batch (monotonic ms); null before the first. */
  private lastAckAt: number | null = null;

  constructor(private readonly o: TrainingLedgerOptions) {}

  /** Starts the clock of the run and the periodic progress telemetry. */
  start(progressIntervalMs: number): void {
    const { clock, stats } = this.o;
    this.startedAt = clock.monotonic();
    this.since.start = this.startedAt;
    this.progress = clock.setInterval(() => {
      const now = clock.monotonic();
      const w = this.since;
      const wire = this.o.compression?.() ?? null;
      const body: ProgressTelemetry = {
        node: this.o.node, group: this.o.group, steps: stats.steps, samples: stats.samples,
        loss: w.samples > 0 ? w.loss / w.samples : null,
        samples_per_s: now > w.start ? (w.samples * 1000) / (now - w.start) : 0,
        round: stats.round, emulated_speed: this.o.emulateSpeed, emulated: this.o.emulated,
        busy_ms: w.busy, emulated_step_ms: w.stepMs, window_ms: Math.max(0, now - w.start),
        first_step_ago_ms: firstStepAgo(this.o.firstStepAt?.() ?? null, now),
        bytes_out: this.o.transport.stats.bytesOut, bytes_in: this.o.transport.stats.bytesIn,
        compression: wire?.choice ?? null, link_utilisation: wire?.linkUtilisation ?? null,
        ...this.holding(),
      };
      publishTelemetry(this.o.transport, this.o.job, 'progress', this.o.node, body);
      this.since = { loss: 0, samples: 0, start: now, busy: 0, stepMs: 0 };
    }, progressIntervalMs);
  }

  stop(): void {
    this.progress?.cancel();
    this.progress = null;
  }

  /** Acknowledges a trained batch, counts it and reports it (`batch` telemetry). */
  async account(item: QueuedBatch, t: TrainedBatch): Promise<void> {
    const { stats, log } = this.o;
    const confirmed = await item.ack();
    this.lastAckAt = this.o.clock.monotonic();
    stats.steps++; stats.samples += t.samples;
    stats.busy_ms += t.computeMs; stats.emulated_step_ms += t.stepMs;
    this.since.samples += t.samples; this.since.loss += t.loss * t.samples; this.lossSum += t.loss * t.samples;
    this.since.busy += t.computeMs; this.since.stepMs += t.stepMs;
    stats.mean_loss = this.lossSum / stats.samples;
    if (t.droppedStale) stats.dropped_stale_batches++;
    if (t.partDropped) stats.part_dropped_batches++;
    if (confirmed) stats.batches_acked++;
    else {
      stats.ack_failures++;
      log.warn({ batch: item.desc.batch_id }, 'the queue did not confirm the acknowledgement (the delivery had expired): the batch may be trained again');
    }
    const tel: BatchTelemetry = {
      node: this.o.node, batch_id: item.desc.batch_id, samples: t.samples, loss: t.loss, redelivered: item.redelivered,
      ack_confirmed: confirmed, staleness: t.staleness, round: t.round, busy_ms: t.computeMs, emulated_step_ms: t.stepMs,
      dropped_stale: t.droppedStale, part_dropped: t.partDropped, window: t.window, group: this.o.batchGroup(),
    };
    publishTelemetry(this.o.transport, this.o.job, 'batch', this.o.node, tel);
    this.o.onBatchTrained?.(tel);
  }

  /**
   * Restarts the ack_wait of the batches held, every third of it: a long wait
   * must not let a held batch be redelivered. While in force, the batches
   * `held` returns are the ones this worker reports holding (`heldBatchIds`).
   */
  keepAlive(held: () => Iterable<QueuedBatch | null>): Timer {
    this.holders.add(held);
    const t = this.o.clock.setInterval(() => { for (const h of held()) h?.working(); }, Math.max(250, Math.floor(this.o.ackWaitMs / 3)));
    return { cancel: () => { t.cancel(); this.holders.delete(held); } };
  }

  /** The ids of the batches this worker holds now: taken from the queue, not yet acknowledged or given back. */
  heldBatchIds(): string[] {
    const ids = new Set<string>();
    for (const held of this.holders) for (const b of held()) if (b !== null) ids.add(b.desc.batch_id);
    return [...ids];
  }

  /** What progress telemetry says of the loop: the batches it holds (the first PROGRESS_HELD_IDS of them) and where it is. */
  private holding(): Pick<ProgressTelemetry, 'held' | 'held_count' | 'loop_state' | 'group_state' | 'windows' | 'last_ack_ago_ms'> {
    const ids = this.heldBatchIds();
    const { stats, clock } = this.o;
    return {
      held: ids.slice(0, PROGRESS_HELD_IDS), held_count: ids.length, loop_state: stats.state, group_state: stats.group_state,
      windows: stats.sync_mode !== null ? stats.windows : null,
      last_ack_ago_ms: this.lastAckAt === null ? null : Math.max(0, clock.monotonic() - this.lastAckAt),
    };
  }
}

/**
 * asp / bsp: one step on a batch from the queue (null: an empty contribution
 * to a bsp round), acknowledged once every push is accepted; on failure the
 * batch is given back at once rather than after ack_wait.
 */
export async function trainQueued(env: WorkerLoopEnv, item: QueuedBatch | null, sync: SyncRound | null): Promise<void> {
  const { stats, ledger } = env;
  if (item?.redelivered) stats.redelivered_taken++;
  const keepAlive = item === null ? null : ledger.keepAlive(() => [item]);
  try {
    const batch = item === null ? null : batchFromDescriptor(env.o.source, item.desc);
    const out = await env.stepper.run(batch, sync);
    keepAlive?.cancel();
    if (item === null || out.loss === null) { stats.empty_rounds++; return; }
    await ledger.account(item, {
      loss: out.loss, samples: out.samples, computeMs: out.computeMs, stepMs: out.stepMs, staleness: out.staleness,
      droppedStale: out.droppedStale, partDropped: out.partDropped, round: sync?.round ?? null, window: null,
    });
  } catch (e) {
    keepAlive?.cancel();
    item?.nak();
    throw e;
  }
}
