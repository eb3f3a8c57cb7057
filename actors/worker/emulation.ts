/**
 * Emulated heterogeneity on one machine (`nodes.<name>.emulate`), always
 * labelled as such in logs, telemetry and results.
 *
 * - Compute: a node at `speed` s takes `reference_step_ms / s` per training
 *   step (`training.emulation_reference_step_ms`). The real compute runs
 *   inside that time and only the remainder is slept, so an emulated node's
 *   pace does not depend on what else shares the CPUs (a stretch factor over
 *   the measured time would: on a busy 2-core machine every node looks slow).
 *   A real step longer than the emulated one cannot be hidden: the node then
 *   runs at its real speed and says so once.
 * - Link: `bandwidth_mbps` holds each transfer (pull reply, push, intra-group
 *   slice) for bytes·8 / bandwidth on the node's one link; transfers queue
 *   behind each other as on a real NIC.
 *
 * Time comes from the injected clock, so both are tested with a simulated one.
 */
import type { Clock, Logger } from '../../runtime/mod.ts';
import { wireTensorBytes, type PullReply, type PullRequest, type PushWire } from '../shard/shard.messages.ts';
import { BusyIntervals } from './link-usage.ts';

export interface StepTiming {
  /** Real compute time of the step (what the CPU did). */
  computeMs: number;
  /** The step as the emulated device took it: max(real, reference / speed); = computeMs when not emulated. */
  stepMs: number;
}

export interface ComputePacerOptions {
  clock: Clock;
  log: Logger;
  node: string;
  /** `emulate.speed`; null: not emulated (steps take their real time). */
  speed: number | null;
  /** `training.emulation_reference_step_ms`: a speed-1 node's step. */
  referenceStepMs: number;
}

export class ComputePacer {
  private warned = false;
  /** ms per step of the emulated device; null when not emulated. */
  readonly targetStepMs: number | null;

  constructor(private readonly o: ComputePacerOptions) {
    this.targetStepMs = o.speed === null ? null : o.referenceStepMs / o.speed;
  }

  get emulated(): boolean { return this.targetStepMs !== null; }

  /**
   * Ends a step whose real compute started at `startMs` (clock.monotonic):
   * sleeps what is left of the emulated step time.
   */
  async finish(startMs: number): Promise<StepTiming> {
    const computeMs = this.o.clock.monotonic() - startMs;
    const target = this.targetStepMs;
    if (target === null) return { computeMs, stepMs: computeMs };
    const rest = target - computeMs;
    if (rest > 0) {
      await this.o.clock.sleep(rest);
      return { computeMs, stepMs: target };
    }
    if (!this.warned) {
      this.warned = true;
      this.o.log.warn({ node: this.o.node, real_step_ms: Math.round(computeMs), emulated_step_ms: Math.round(target), emulated_speed: this.o.speed },
        `emulation cannot keep up: a real step took ${computeMs.toFixed(0)} ms, longer than the emulated ${target.toFixed(0)} ms `
        + `(training.emulation_reference_step_ms / emulate.speed); node ${this.o.node} runs at its real speed when that happens (raise the reference)`);
    }
    return { computeMs, stepMs: computeMs };
  }
}

/** One node's emulated network link; null bandwidth lets every transfer through at once. */
export class EmulatedLink {
  private busyUntil = Number.NEGATIVE_INFINITY;
  private delayedMs = 0;
  /**
   * When the link carried bytes: each transfer occupies [its start, + its
   * transfer time], its start being when the transfers queued before it
   * are through. Exact, so link utilisation (link-usage.ts) reads it.
   */
  readonly busy: BusyIntervals;

  /** `keepMs`: how much of its busy time the link remembers (default the utilisation window). */
  constructor(private readonly clock: Clock, readonly bandwidthMbps: number | null, keepMs?: number) {
    this.busy = new BusyIntervals(keepMs);
  }

  /** Milliseconds `bytes` take on the link. */
  transferMs(bytes: number): number {
    return this.bandwidthMbps === null || bytes <= 0 ? 0 : (bytes * 8) / (this.bandwidthMbps * 1_000);
  }

  /** Holds a transfer of `bytes` until the link has carried it (after the transfers queued before it). */
  async transfer(bytes: number): Promise<void> {
    const wait = this.occupy(bytes);
    if (wait <= 0) return;
    this.delayedMs += wait;
    await this.clock.sleep(wait);
  }

  /**
   * Queues `bytes` on the link — busy from when the transfers queued before
   * them are through, for their transfer time — without holding anyone; the
   * milliseconds until they are through. `transfer` waits that long; a link
   * modelled from a measured bandwidth (link-usage.ts) only records it.
   */
  occupy(bytes: number): number {
    const ms = this.transferMs(bytes);
    if (ms <= 0) return 0;
    const now = this.clock.monotonic();
    const start = Math.max(now, this.busyUntil);
    this.busyUntil = start + ms;
    this.busy.add(start, this.busyUntil, now);
    return this.busyUntil - now;
  }

  /** Total time transfers were held (their queueing included), for telemetry. */
  get totalDelayMs(): number { return this.delayedMs; }
}

/**
 * Tensor bytes of a push as sent (ids and gradients, compressed ones at 2
 * bytes an element), its later steps included (a group window's push carries
 * one step per step index); headers are small next to them.
 */
export function pushBytes(req: Pick<PushWire, 'dense' | 'sparse' | 'later_steps'>): number {
  let n = wireTensorBytes(req);
  for (const l of req.later_steps ?? []) n += wireTensorBytes(l);
  return n;
}

/** Tensor bytes of a pull: the ids asked for and the values answered (as sent: a compressed reply's halves at 2 bytes). */
export function pullBytes(req: PullRequest, reply: PullReply): number {
  let n = req.dense.byteLength;
  for (const s of req.sparse) n += s.ids.byteLength;
  if (reply.wireBytes !== undefined) return n + reply.wireBytes;
  for (const d of reply.dense) n += d.byteLength;
  for (const s of reply.sparse) n += s.byteLength;
  return n;
}
