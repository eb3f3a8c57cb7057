/**
 * The monitor's aggregation of a run's telemetry: the exactly-once
 * accounting (each batch id acknowledged once), progress, each worker's busy
 * time (utilisation) and, when asked, a test-loss curve from evaluations that
 * run while training does. The monitor actor (monitor.actor.ts) owns one;
 * `status`, the progress line and the run summary all read it.
 * Transport-neutral: the same code follows a NATS job and an embedded one.
 */
import { HetpsError, type Clock, type Logger, type Transport } from '../../runtime/mod.ts';
import type { Evaluation } from '../../native-bridge/mod.ts';
import type { BatchQueue } from '../store/batch-queue.ts';
import type { PreparedJob } from '../scheduler/job.ts';
import { subscribeTelemetry, type ProgressTelemetry } from './telemetry.ts';

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
  /** Latest test loss of the periodic evaluation; null before the first (or without it). */
  test_loss: number | null;
}

/** One periodic evaluation: the parameters the shards held `t_s` seconds into training, after `samples` acknowledged samples. */
export interface CurvePoint {
  t_s: number;
  samples: number;
  test_loss: number;
  /** ctr models; null for mlp. */
  test_auc: number | null;
  /** mlp models; null for ctr. */
  test_accuracy: number | null;
}

/** Time spent on steps over the training window, per worker. */
export interface NodeUtilisation {
  /**
   * Seconds the (emulated) device spent in steps: the batches' `emulated_step_ms`
   * telemetry (= real compute on a node that is not emulated), or steps × nominal
   * step time when the telemetry has none; see `busy_from`.
   */
  busy_s: number;
  /** busy_s / the training window. */
  utilisation: number;
  /** Real compute of the step graphs (the host's share), seconds; null when not reported. */
  compute_s: number | null;
  steps: number;
  samples: number;
  emulated_speed: number | null;
  /** hps: batches whose update a shard refused as too stale. */
  dropped_stale: number;
  /** hps: batches whose update a shard applied without its dense blocks or its rows (training.max_staleness { dense, sparse }). */
  part_dropped: number;
  /** hps: where the worker's windows spent their time, seconds by phase (from its done telemetry); null otherwise. */
  window_phases_s: Record<string, number> | null;
  /** hps: windows the worker went through (done telemetry); null otherwise. */
  windows: number | null;
  /** Times the worker left the queue's last batches to faster workers (training.tail_dispatch; done telemetry). */
  tail_declined: number;
  /** `telemetry`: the worker's own step times; `nominal`: steps × the node's nominal step time; `none`: neither was available. */
  busy_from: 'telemetry' | 'nominal' | 'none';
}

export interface UtilisationReport {
  /** The training window every worker is measured against: first worker loop start to last acknowledgement. */
  wall_s: number;
  /** Mean over the workers. */
  mean: number;
  per_node: Record<string, NodeUtilisation>;
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
  /** When the run's first training step began, seconds after the first worker loop started (the curve's origin); null if no worker reported one. */
  first_step_s: number | null;
  samples_per_s: number;
  /** Sample-weighted mean loss over the last 10% of acknowledged batches. */
  final_loss: number | null;
  per_worker: Record<string, number>;
  /** hps: batches acknowledged per worker per group it trained them in (a regroup moves a worker). */
  per_worker_group: Record<string, Record<string, number>>;
  /** Batch ids never acknowledged (empty on success). */
  missing: string[];
  /** The periodic evaluations, in time order (empty without `evaluation`). */
  curve: CurvePoint[];
  utilisation: UtilisationReport;
}

/** What `liveFigures` returns. */
export interface LiveFigures {
  progress: { samples: number; batches_acked: number; batches_total: number | null; samples_per_s: number; loss: number | null; elapsed_s: number };
  /** Per worker that reported anything: `loop` is how its training loop ended (null while it runs). */
  workers: Record<string, {
    steps: number; samples: number; samples_per_s: number; loop: string | null; utilisation: number | null;
    /** The batches it holds (taken, not yet acknowledged) as its latest progress telemetry names them (at most 32) and their count; null: not reported. */
    held: string[] | null; held_count: number | null;
  }>;
}

/** One periodic evaluation as it completes. */
export interface EvaluationPoint { samples: number; logloss: number; auc: number | null; accuracy: number | null }

export interface PeriodicEvaluation {
  /** Between evaluation starts; one also runs as training starts and one when it has ended. */
  everyMs: number;
  run: () => Promise<Evaluation>;
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
  /** Evaluate while training runs (the `curve` of the report). */
  evaluation?: PeriodicEvaluation;
  /**
   * A worker's nominal step time in ms (an emulated node's reference step time
   * / speed), for its busy time when its telemetry carries none (an older
   * worker); null: unknown.
   */
  nominalStepMs?: (node: string) => number | null;
  /** Called once when the first worker loop has started (seen within a poll) and once when the last batch is in, before the final evaluation. */
  onTrainingStart?: () => void;
  onTrainingEnd?: () => void;
}

interface WorkerActivity {
  steps: number;
  samples: number;
  emulatedSpeed: number | null;
  /** Sum of the step times the worker reported (emulated, else real); null while it reports none. */
  stepMs: number | null;
  /** Sum of the real compute it reported; null while it reports none. */
  computeMs: number | null;
  droppedStale: number;
  partDropped: number;
  windowPhasesS: Record<string, number> | null;
  windows: number | null;
  tailDeclined: number;
}

function newActivity(): WorkerActivity {
  return { steps: 0, samples: 0, emulatedSpeed: null, stepMs: null, computeMs: null, droppedStale: 0, partDropped: 0, windowPhasesS: null, windows: null, tailDeclined: 0 };
}

/** Batch ids a stall warning names per holder (and of those held by no one); the rest are counted. */
const STALL_IDS_SHOWN = 8;

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
  private readonly perWorkerGroup: Record<string, Record<string, number>> = {};
  private readonly done = new Map<string, string>();
  /** When the first worker loop started and the last batch was acknowledged (monotonic ms), for the throughput. */
  private firstStart: number | null = null;
  private readonly evaluationListeners: ((e: EvaluationPoint) => void)[] = [];
  /** When the run's first training step began (clock.monotonic, from the workers' progress telemetry); null before any. */
  private firstStep: number | null = null;
  private lastAck: number | null = null;
  private unconfirmed = 0;
  private redelivered = 0;
  private readonly unsubscribe: () => void;

  /** Last telemetry of any kind per worker (monotonic ms): a liveness hint until heartbeats exist. */
  private readonly lastSeen = new Map<string, number>();
  private readonly activity = new Map<string, WorkerActivity>();
  /** Each worker's latest progress telemetry and when it arrived (monotonic ms): its samples/s, and who holds which batches. */
  private readonly latestProgress = new Map<string, { t: ProgressTelemetry; at: number }>();

  private activityOf(node: string): WorkerActivity {
    let a = this.activity.get(node);
    if (!a) { a = newActivity(); this.activity.set(node, a); }
    return a;
  }

  constructor(transport: Transport, job: string, private readonly clock: Clock, private readonly log: Logger) {
    const seen = (node: string) => { this.lastSeen.set(node, this.clock.monotonic()); };
    this.unsubscribe = subscribeTelemetry(transport, job, {
      progress: (t) => {
        seen(t.node);
        this.latestProgress.set(t.node, { t, at: this.clock.monotonic() });
        if (t.first_step_ago_ms !== null) {
          const at = this.clock.monotonic() - t.first_step_ago_ms;
          if (this.firstStep === null || at < this.firstStep) this.firstStep = at;
        }
      },
      batch: (t) => {
        seen(t.node);
        const a = this.activityOf(t.node);
        a.steps++; a.samples += t.samples;
        const stepMs = t.emulated_step_ms ?? t.busy_ms;
        if (stepMs !== null) a.stepMs = (a.stepMs ?? 0) + stepMs;
        if (t.busy_ms !== null) a.computeMs = (a.computeMs ?? 0) + t.busy_ms;
        if (t.dropped_stale) a.droppedStale++;
        if (t.part_dropped) a.partDropped++;
        if (t.redelivered) this.redelivered++;
        if (!t.ack_confirmed) { this.unconfirmed++; return; }
        const n = (this.acks.get(t.batch_id) ?? 0) + 1;
        this.acks.set(t.batch_id, n);
        this.perWorker[t.node] = (this.perWorker[t.node] ?? 0) + 1;
        if (n > 1) { this.log.warn({ batch: t.batch_id, node: t.node, times: n }, 'batch acknowledged more than once'); return; }
        if (t.group !== null) {
          const g = (this.perWorkerGroup[t.node] ??= {});
          g[t.group] = (g[t.group] ?? 0) + 1;
        }
        this.batchTelemetry.push({ id: t.batch_id, node: t.node, samples: t.samples, loss: t.loss });
        this.lastAck = this.clock.monotonic();
      },
      start: (t) => { seen(t.node); this.firstStart ??= this.clock.monotonic(); this.activityOf(t.node).emulatedSpeed = t.emulated_speed; },
      done: (t) => {
        seen(t.node);
        this.done.set(t.node, t.reason);
        this.activityOf(t.node).tailDeclined = t.tail_declined;
        if (t.window_phases_ms !== null) this.activityOf(t.node).windows = t.windows;
        if (t.window_phases_ms !== null) this.activityOf(t.node).windowPhasesS = Object.fromEntries(Object.entries(t.window_phases_ms).map(([k, v]) => [k, Math.round(v) / 1000]));
      },
    });
  }

  dispose(): void { this.unsubscribe(); }

  /**
   * The figures now, for `ctl.status` and the dashboard: what was
   * acknowledged (once per batch id), throughput since the first worker
   * started, the mean loss of the last `lossWindow` acknowledged batches, and
   * per worker its steps, samples and its last reported samples/s.
   */
  /** The ids of the batches whose acknowledgement was reported (confirmed by the queue). */
  ackedBatches(): Set<string> { return new Set(this.acks.keys()); }

  /** Calls `f` with each periodic evaluation as it completes (the dashboard's test loss line, `/metrics`). */
  onEvaluation(f: (e: EvaluationPoint) => void): () => void {
    this.evaluationListeners.push(f);
    return () => { const i = this.evaluationListeners.indexOf(f); if (i >= 0) this.evaluationListeners.splice(i, 1); };
  }

  liveFigures(totalBatches: number | null, lossWindow = 50): LiveFigures {
    let samples = 0;
    for (const t of this.batchTelemetry) samples += t.samples;
    const recent = this.batchTelemetry.slice(-lossWindow);
    let l = 0; let n = 0;
    for (const t of recent) { l += t.loss * t.samples; n += t.samples; }
    const end = this.lastAck ?? this.clock.monotonic();
    const elapsedS = this.firstStart === null ? 0 : Math.max(0, end - this.firstStart) / 1000;
    const workers: LiveFigures['workers'] = {};
    for (const [node, a] of this.activity) {
      const p = this.latestProgress.get(node)?.t;
      workers[node] = {
        steps: a.steps, samples: a.samples, samples_per_s: p?.samples_per_s ?? 0, loop: this.done.get(node) ?? null,
        utilisation: a.stepMs === null || elapsedS <= 0 ? null : Math.min(1, a.stepMs / 1000 / elapsedS),
        held: p?.held ?? null, held_count: p?.held_count ?? null,
      };
    }
    return {
      progress: {
        samples, batches_acked: this.acks.size, batches_total: totalBatches, samples_per_s: elapsedS > 0 ? samples / elapsedS : 0,
        loss: n > 0 ? l / n : null, elapsed_s: elapsedS,
      },
      workers,
    };
  }

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
    // Periodic evaluation: points keep their monotonic start time until the training window is known.
    const evaluated: { at: number; samples: number; e: Evaluation }[] = [];
    let evalInFlight: Promise<void> | null = null;
    let lastEvalAt = Number.NEGATIVE_INFINITY;
    const startEvaluation = (): Promise<void> => {
      absorb();
      const at = clock.monotonic();
      const samplesAt = samples;
      lastEvalAt = at;
      const p = o.evaluation!.run().then(
        (e) => {
          evaluated.push({ at, samples: samplesAt, e });
          for (const f of this.evaluationListeners) f({ samples: samplesAt, logloss: e.logloss, auc: e.kind === 'ctr' ? e.auc : null, accuracy: e.kind === 'mlp' ? e.accuracy : null });
        },
        (e: unknown) => { log.warn({ err: (e as Error).message }, 'periodic evaluation failed; training goes on'); },
      ).finally(() => { evalInFlight = null; });
      evalInFlight = p;
      return p;
    };
    const maybeEvaluate = (now: number) => {
      if (o.evaluation && evalInFlight === null && now - lastEvalAt >= o.evaluation.everyMs) void startEvaluation();
    };

    const report = (): TrainingProgress => {
      absorb();
      const elapsed = (clock.monotonic() - (this.firstStart ?? clock.monotonic())) / 1000;
      const latest = evaluated.length ? evaluated[evaluated.length - 1]!.e.logloss : null;
      const p: TrainingProgress = {
        samples, total_samples: totalSamples, batches_acked: this.acks.size, total_batches: total,
        samples_per_s: elapsed > 0 ? samples / elapsed : 0, loss: windowSamples > 0 ? windowLoss / windowSamples : null,
        elapsed_s: elapsed, per_worker: { ...this.perWorker }, test_loss: latest,
      };
      windowLoss = 0; windowSamples = 0;
      return p;
    };

    let lastProgress = start;
    let lastStallNote = start;
    let emptySince: number | null = null;
    const stallWarnMs = o.stallWarnMs ?? 30_000;
    let startNoted = false;
    for (;;) {
      await clock.sleep(250);
      absorb();
      const now = clock.monotonic();
      if (!startNoted && this.firstStart !== null) {
        // Workers start once every shard serves: the first point is the parameters at (about) the start of training.
        startNoted = true;
        o.onTrainingStart?.();
      }
      if (startNoted) maybeEvaluate(now);
      if (now - lastProgress >= (o.progressEveryMs ?? 1_000)) { lastProgress = now; o.onProgress(report()); }
      const reason = o.check?.() ?? null;
      const pending = await o.queue.pending().catch((e: unknown) => { log.warn({ err: (e as Error).message }, 'cannot read the queue'); return -1; });
      // An empty queue means every batch was acknowledged, even when the worker that did it died before reporting it.
      if (reason !== null && pending !== 0) throw new HetpsError(`training cannot finish: ${reason} (${this.acks.size}/${total} batches acknowledged)`);
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
        const undelivered = await o.queue.undelivered().catch(() => null);
        const stall = this.stallReport(prepared, running, undelivered);
        log.warn({ pending, acked: this.acks.size, total, workers_running: running, ...stall.fields },
          `no batch acknowledged for ${Math.round((now - lastAckAt) / 1000)} s: ${pending} unacknowledged batch(es)${stall.text}; workers still running: ${running.join(', ') || 'none'}`
          + (prepared.info.mode === 'bsp' ? ' (bsp waits for every worker each round)' : ''));
      }
    }
    if (!startNoted) o.onTrainingStart?.();
    o.onTrainingEnd?.();
    // The trained parameters, on the same subset as the points before.
    if (o.evaluation) {
      await evalInFlight;
      await startEvaluation();
    }
    // The workers' end-of-loop reports (hps window phases) follow the last acknowledgement by a moment.
    const doneBy = clock.monotonic() + (o.telemetryGraceMs ?? 5_000);
    while (!prepared.info.workers.every((w) => this.done.has(w)) && clock.monotonic() < doneBy) {
      await clock.sleep(50);
      absorb();
    }
    o.onProgress(report());
    // Training time: from the first worker loop to the last acknowledgement (node start-up is not training).
    const trainS = this.firstStart !== null && this.lastAck !== null ? Math.max(0, this.lastAck - this.firstStart) / 1000 : (clock.monotonic() - start) / 1000;
    const origin = this.firstStart ?? start;
    const curve: CurvePoint[] = evaluated.map(({ at, samples: n, e }) => ({
      t_s: Math.max(0, at - origin) / 1000, samples: n, test_loss: e.logloss,
      test_auc: e.kind === 'ctr' ? e.auc : null, test_accuracy: e.kind === 'mlp' ? e.accuracy : null,
    }));
    let duplicate = 0;
    for (const n of this.acks.values()) duplicate += n - 1;
    const tail = this.batchTelemetry.slice(Math.floor(this.batchTelemetry.length * 0.9));
    let tl = 0; let ts = 0;
    for (const t of tail) { const s = samplesOf.get(t.id) ?? t.samples; tl += t.loss * s; ts += s; }
    return {
      samples, batches: total, batches_acked: this.acks.size, duplicate_acks: duplicate, unconfirmed_acks: this.unconfirmed, redelivered: this.redelivered,
      train_s: trainS, first_step_s: this.firstStep === null ? null : Math.max(0, this.firstStep - origin) / 1000, samples_per_s: trainS > 0 ? samples / trainS : 0, final_loss: ts > 0 ? tl / ts : null,
      per_worker: { ...this.perWorker }, per_worker_group: JSON.parse(JSON.stringify(this.perWorkerGroup)) as Record<string, Record<string, number>>, missing: prepared.descriptors.filter((d) => !this.acks.has(d.batch_id)).map((d) => d.batch_id),
      curve, utilisation: this.utilisation(prepared.info.workers, trainS, o.nominalStepMs ?? (() => null)),
    };
  }

  /**
   * Who holds the batches not acknowledged yet, as the workers' latest
   * progress telemetry says: each holder with its loop's and group's state,
   * and the batches no worker reports holding (not delivered yet, or
   * delivered to a worker that lost them: back after ack_wait).
   */
  private stallReport(prepared: PreparedJob, running: readonly string[], undelivered: number | null): { text: string; fields: Record<string, unknown> } {
    const now = this.clock.monotonic();
    const missing = prepared.descriptors.filter((d) => !this.acks.has(d.batch_id)).map((d) => d.batch_id);
    const open = new Set(missing);
    const heldBy = new Set<string>();
    const holders: Record<string, unknown>[] = [];
    /** Workers reporting that they hold none of them, with where their loops and groups are (a mate a group left behind is told apart this way). */
    const idle: Record<string, unknown>[] = [];
    const parts: string[] = [];
    const secs = (ms: number | null) => (ms === null ? '?' : `${Math.round(ms / 1000)} s`);
    const list = (ids: readonly string[], count: number) => ids.slice(0, STALL_IDS_SHOWN).join(', ') + (count > STALL_IDS_SHOWN ? `, … (+${count - STALL_IDS_SHOWN} more)` : '');
    for (const node of running) {
      const p = this.latestProgress.get(node);
      if (p === undefined || p.t.held === null) continue;
      const ids = p.t.held.filter((id) => open.has(id));
      for (const id of ids) heldBy.add(id);
      const reportedAgo = now - p.at;
      const group = p.t.group_state !== null ? `group ${p.t.group}: ${p.t.group_state}${p.t.windows !== null ? ` after ${p.t.windows} window(s)` : ''}` : null;
      if (ids.length === 0) {
        idle.push({ node, loop_state: p.t.loop_state, group: p.t.group, group_state: p.t.group_state, windows: p.t.windows, reported_ago_ms: reportedAgo, text: `${node} (loop ${p.t.loop_state ?? '?'}${group === null ? '' : `, ${group}`})` });
        continue;
      }
      const lastAck = p.t.last_ack_ago_ms === null ? null : p.t.last_ack_ago_ms + reportedAgo;
      const where = [`loop ${p.t.loop_state ?? '?'}`];
      if (group !== null) where.push(group);
      where.push(lastAck === null ? 'no batch acknowledged yet' : `its last acknowledgement ${secs(lastAck)} ago`);
      where.push(`reported ${secs(reportedAgo)} ago`);
      parts.push(`${node} holds ${ids.length} (${list(ids, ids.length)}; ${where.join(', ')})`);
      holders.push({ node, held: ids, loop_state: p.t.loop_state, group: p.t.group, group_state: p.t.group_state, windows: p.t.windows, last_ack_ago_ms: lastAck, reported_ago_ms: reportedAgo });
    }
    const unheld = missing.filter((id) => !heldBy.has(id));
    const silent = running.filter((w) => this.latestProgress.get(w)?.t.held == null);
    const truncated = running.filter((w) => { const t = this.latestProgress.get(w)?.t; return t != null && t.held !== null && (t.held_count ?? 0) > t.held.length; });
    if (unheld.length > 0) {
      parts.push(`held by no worker that reports: ${unheld.length} (${list(unheld, unheld.length)}; `
        + (undelivered !== null ? `the queue has ${undelivered} not delivered yet; ` : '')
        + `a delivered batch that nobody holds goes back to the queue after ack_wait, ${secs(prepared.info.ack_wait_ms)})`
        + (silent.length > 0 ? `; no holdings reported by ${silent.join(', ')}` : '')
        + truncated.map((w) => `; ${w} holds ${this.latestProgress.get(w)!.t.held_count}, named only in part`).join(''));
    }
    if (idle.length > 0) parts.push(`holding none: ${idle.map((i) => i.text).join(', ')}`);
    return {
      text: parts.length > 0 ? ` — ${parts.join('; ')}` : '',
      fields: { holders, idle: idle.map(({ text: _text, ...rest }) => rest), unheld: unheld.slice(0, STALL_IDS_SHOWN), undelivered },
    };
  }

  /** Busy time over the training window per worker: its reported step times where telemetry has them, else steps × nominal step time. */
  private utilisation(workers: readonly string[], wallS: number, nominalStepMs: (node: string) => number | null): UtilisationReport {
    const perNode: Record<string, NodeUtilisation> = {};
    for (const w of workers) {
      const a = this.activity.get(w) ?? newActivity();
      const nominal = nominalStepMs(w);
      const busyFrom: NodeUtilisation['busy_from'] = a.stepMs !== null ? 'telemetry' : nominal !== null ? 'nominal' : 'none';
      const busyS = (a.stepMs ?? (nominal !== null ? a.steps * nominal : 0)) / 1000;
      perNode[w] = {
        busy_s: busyS, utilisation: wallS > 0 ? busyS / wallS : 0, compute_s: a.computeMs === null ? null : a.computeMs / 1000,
        steps: a.steps, samples: a.samples, emulated_speed: a.emulatedSpeed, dropped_stale: a.droppedStale, part_dropped: a.partDropped, busy_from: busyFrom,
        window_phases_s: a.windowPhasesS, windows: a.windows, tail_declined: a.tailDeclined,
      };
    }
    const values = Object.values(perNode).map((n) => n.utilisation);
    return { wall_s: wallS, mean: values.length ? values.reduce((x, y) => x + y, 0) / values.length : 0, per_node: perNode };
  }
}
