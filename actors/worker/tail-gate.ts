/**
 * The worker's side of tail dispatch (`training.tail_dispatch`; the rule is
 * topology/tail-dispatch.ts): before taking a batch, a worker that has faster
 * peers asks whether they would take every batch still waiting before it
 * finished one — and if so leaves them to the faster ones.
 *
 * Rates come from the workers' `progress` telemetry (every worker's, this
 * one's included): samples trained over the last `windowMs`, once a worker has
 * reported over at least `minSpanMs` (before that it is not counted, and a
 * worker that does not know its own rate takes). A worker whose reports stop
 * (it died, or finished: its `done` telemetry) drops out after `windowMs`, so
 * the slower ones take again — the gate never leaves batches to no one for
 * longer than that.
 *
 * The queue's undelivered count is asked for (one JetStream consumer-info
 * request) only by a worker that has faster peers, and at most every
 * `askEveryMs`; between two asks it is estimated from the last answer and
 * the rates.
 */
import type { Clock, Logger, Transport } from '../../runtime/mod.ts';
import { tailDecision } from '../../topology/mod.ts';
import type { BatchQueue } from '../store/batch-queue.ts';
import { subscribeTelemetry } from '../monitor/telemetry.ts';

export interface TailGateOptions {
  transport: Transport;
  job: string;
  node: string;
  queue: BatchQueue;
  clock: Clock;
  log: Logger;
  /** Rates are measured over this much of the latest progress telemetry (default 20 s). */
  windowMs?: number;
  /** A worker's rate counts once its reports span this long (default 6 s: three progress intervals). */
  minSpanMs?: number;
  /** The least time between two asks for the queue's undelivered count (default 500 ms). */
  askEveryMs?: number;
  /** Samples per batch as this worker has seen them (turns rates into batches); null while unknown. */
  samplesPerBatch?: () => number | null;
  /** Called with the count each time the gate leaves a batch to faster workers (the worker's stats). */
  onDeclined?: (declined: number) => void;
}

/** How long a worker that left the last batches to faster ones waits before it looks again. */
export const TAIL_RECHECK_MS = 500;
/** More waiting batches than this many times what the faster workers take meanwhile: far from the tail. */
const FAR = 4;
/** How long a count far from the tail is used without asking again. */
const FAR_ASK_MS = 2_000;

interface Reports {
  /** (monotonic ms, cumulative samples), oldest first, within the window. */
  points: { at: number; samples: number }[];
}

export class TailGate {
  private readonly peers = new Map<string, Reports>();
  private unsubscribe: (() => void) | null = null;
  private asked: { at: number; undelivered: number } | null = null;
  private readonly windowMs: number;
  private readonly minSpanMs: number;
  private readonly askEveryMs: number;
  /** Batches left to faster workers so far. */
  declined = 0;
  private lastLogged = -Infinity;
  /**
   * This worker's rate over a window in which it never left batches to
   * others: a worker the gate keeps idle does not look slower for waiting.
   */
  private ownRate: number | null = null;
  private lastDeclinedAt = -Infinity;

  constructor(private readonly o: TailGateOptions) {
    this.windowMs = o.windowMs ?? 20_000;
    this.minSpanMs = o.minSpanMs ?? 6_000;
    this.askEveryMs = o.askEveryMs ?? 500;
  }

  start(): void {
    this.unsubscribe = subscribeTelemetry(this.o.transport, this.o.job, {
      progress: (t) => this.note(t.node, t.samples),
      done: (t) => { if (t.node !== this.o.node) this.peers.delete(t.node); },
    });
  }

  stop(): void {
    this.unsubscribe?.();
    this.unsubscribe = null;
  }

  /** A worker's cumulative samples as its progress telemetry reported them (also for tests). */
  note(node: string, samples: number, at = this.o.clock.monotonic()): void {
    let r = this.peers.get(node);
    if (r === undefined) { r = { points: [] }; this.peers.set(node, r); }
    const last = r.points[r.points.length - 1];
    // A restarted worker counts from zero again.
    if (last !== undefined && samples < last.samples) r.points.length = 0;
    r.points.push({ at, samples });
  }

  /** Samples per second of `node` over the window; null while its reports span less than minSpanMs or stopped. */
  rate(node: string, now = this.o.clock.monotonic()): number | null {
    const r = this.peers.get(node);
    if (r === undefined) return null;
    const from = now - this.windowMs;
    while (r.points.length > 0 && r.points[0]!.at < from) r.points.shift();
    if (r.points.length < 2) {
      if (r.points.length === 0) this.peers.delete(node);
      return null;
    }
    const first = r.points[0]!;
    const last = r.points[r.points.length - 1]!;
    // Reports that stopped (a dead or paused worker): its rate fades as its last report ages.
    const span = now - first.at;
    if (last.at - first.at < this.minSpanMs) return null;
    return ((last.samples - first.samples) * 1000) / span;
  }

  /** Every worker's rate now, measured once for a decision: this worker's (0: unknown), the others', and their sum. */
  private rates(now: number): { own: number; peers: number[]; total: number } {
    const measured = this.rate(this.o.node, now);
    if (measured !== null && measured > 0 && (this.ownRate === null || now - this.lastDeclinedAt > this.windowMs)) this.ownRate = measured;
    const peers: number[] = [];
    for (const node of [...this.peers.keys()]) {
      if (node === this.o.node) continue;
      const r = this.rate(node, now);
      if (r !== null) peers.push(r);
    }
    return { own: this.ownRate ?? 0, peers, total: peers.reduce((a, b) => a + b, measured ?? 0) };
  }

  /**
   * Whether to take the queue's next batch now. True unless faster workers
   * would take every waiting batch before this one finished one (and for a
   * worker without faster peers, without asking the queue).
   */
  async allows(): Promise<boolean> {
    const now = this.o.clock.monotonic();
    const r = this.rates(now);
    const first = tailDecision({ undelivered: Number.POSITIVE_INFINITY, ownRate: r.own, peerRates: r.peers });
    if (first.faster === 0) return true;
    let undelivered: number;
    if (this.asked !== null && (now - this.asked.at < this.askEveryMs || this.farFromTail(now, first.fasterCapacity, r.total))) {
      // The last count, less what the workers took since (as far as their rates tell).
      undelivered = Math.max(1, Math.round(this.estimate(now, r.total) ?? this.asked.undelivered));
    } else {
      try {
        undelivered = await this.o.queue.undelivered();
      } catch (e) {
        // The queue cannot say: take, as without the gate.
        this.o.log.debug({ err: (e as Error).message }, 'tail dispatch: the queue did not say how many batches wait; taking');
        return true;
      }
      this.asked = { at: now, undelivered };
    }
    if (undelivered === 0) return true;
    const d = tailDecision({ undelivered, ownRate: r.own, peerRates: r.peers });
    if (d.take) return true;
    this.declined++;
    this.lastDeclinedAt = now;
    this.o.onDeclined?.(this.declined);
    if (now - this.lastLogged > 5_000) {
      this.lastLogged = now;
      this.o.log.info({ undelivered, faster_workers: d.faster, faster_capacity: Number(d.fasterCapacity.toFixed(1)) },
        `tail dispatch: ${undelivered} batch(es) left, which ${d.faster} faster worker(s) take before ${this.o.node} would finish one; leaving them to them (training.tail_dispatch)`);
    }
    return false;
  }

  /**
   * True when the next `allows()` may say no: this worker has faster peers
   * and the queue was not seen far from its tail lately. A batch must not be
   * fetched ahead then.
   */
  mayDecline(): boolean {
    const now = this.o.clock.monotonic();
    const r = this.rates(now);
    const d = tailDecision({ undelivered: Number.POSITIVE_INFINITY, ownRate: r.own, peerRates: r.peers });
    if (d.faster === 0) return false;
    return !this.farFromTail(now, d.fasterCapacity, r.total);
  }

  /**
   * The last count, less what every worker has taken since by their rates,
   * is still more than FAR × what the faster workers take in one of this
   * worker's steps (and the count is at most FAR_ASK_MS old): the last count
   * may be used again.
   */
  private farFromTail(now: number, capacity: number, total: number): boolean {
    const a = this.asked;
    if (a === null || now - a.at >= FAR_ASK_MS) return false;
    const e = this.estimate(now, total);
    return e !== null && e > FAR * capacity;
  }

  /** The last count less the batches every worker took since at `total` samples/s; null while samples per batch are unknown. */
  private estimate(now: number, total: number): number | null {
    const a = this.asked;
    const perBatch = this.o.samplesPerBatch?.() ?? null;
    if (a === null || perBatch === null || !(perBatch > 0)) return null;
    return a.undelivered - ((now - a.at) / 1000) * (total / perBatch);
  }
}
