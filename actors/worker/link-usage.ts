/**
 * How busy a worker's link has been lately: what adaptive gradient
 * compression decides on (topology/compression.ts says what utilisation
 * means and how it is measured with and without an emulated link).
 */
import type { Clock } from '../../runtime/mod.ts';
import { LINK_UTILISATION_MIN_SPAN_MS, LINK_UTILISATION_WINDOW_MS } from '../../topology/mod.ts';
import type { EmulatedLink } from './emulation.ts';

/**
 * Busy time as disjoint intervals in time order, forgetting those that
 * ended more than `keepMs` before the latest add. Intervals are added in
 * order of their start (a link's queue, or the in-flight tracking of
 * LinkUsage); one that overlaps the last is merged into it, so overlap
 * counts once.
 */
export class BusyIntervals {
  private readonly spans: { start: number; end: number }[] = [];
  /** Start of the first interval ever added; null before one. */
  firstStart: number | null = null;

  constructor(private readonly keepMs = LINK_UTILISATION_WINDOW_MS) {}

  /** Marks [start, end) busy; `now` (default `start`): what is older than now − keepMs is forgotten. */
  add(start: number, end: number, now = start): void {
    if (!(end > start)) return;
    this.firstStart = Math.min(this.firstStart ?? start, start);
    const last = this.spans.at(-1);
    if (last !== undefined && start <= last.end) {
      last.start = Math.min(start, last.start);
      last.end = Math.max(end, last.end);
    } else {
      this.spans.push({ start, end });
    }
    const forgetBefore = now - this.keepMs;
    let drop = 0;
    while (drop < this.spans.length - 1 && this.spans[drop]!.end < forgetBefore) drop++;
    if (drop > 0) this.spans.splice(0, drop);
  }

  /** Busy milliseconds inside [from, to] (exact for the last keepMs). */
  between(from: number, to: number): number {
    let busy = 0;
    for (let i = this.spans.length - 1; i >= 0; i--) {
      const s = this.spans[i]!;
      if (s.end <= from) break;
      busy += Math.max(0, Math.min(s.end, to) - Math.max(s.start, from));
    }
    return busy;
  }
}

export interface LinkUsageOptions {
  /** The worker's requests cross a network (NATS); false: the embedded in-process bus, where there is no link to be busy. */
  network: boolean;
  /** Default LINK_UTILISATION_WINDOW_MS. */
  windowMs?: number;
  /** Default LINK_UTILISATION_MIN_SPAN_MS. */
  minSpanMs?: number;
}

/** What a worker's link utilisation is measured from. */
export type LinkMeasure = 'emulated link' | 'waits on pulls, pushes and slices' | 'none (embedded bus, no link)';

/**
 * The worker's link utilisation. With an emulated link (a bandwidth set)
 * it is the emulated link's busy time, exact; without, over NATS, the time
 * the worker has requests in flight that `waitOn` wraps (pulls, pushes,
 * group-slice sends), overlapping requests counted once. On the embedded
 * bus without an emulated link there is no link: never measured (null), so
 * adaptive compression keeps float32 (waits there are other nodes' compute
 * on the same event loop, not transfers).
 */
export class LinkUsage {
  private readonly waits: BusyIntervals;
  private inFlight = 0;
  private openedAt = 0;
  private readonly windowMs: number;
  private readonly minSpanMs: number;
  readonly measure: LinkMeasure;

  constructor(private readonly clock: Clock, private readonly link: EmulatedLink, o: LinkUsageOptions) {
    this.windowMs = o.windowMs ?? LINK_UTILISATION_WINDOW_MS;
    this.minSpanMs = o.minSpanMs ?? LINK_UTILISATION_MIN_SPAN_MS;
    this.waits = new BusyIntervals(this.windowMs);
    this.measure = link.bandwidthMbps !== null ? 'emulated link' : o.network ? 'waits on pulls, pushes and slices' : 'none (embedded bus, no link)';
  }

  /** Runs `request`, counting the time it is in flight as link time (without an emulated link). */
  async waitOn<T>(request: () => Promise<T>): Promise<T> {
    if (this.inFlight++ === 0) this.openedAt = this.clock.monotonic();
    try {
      return await request();
    } finally {
      if (--this.inFlight === 0) this.waits.add(this.openedAt, this.clock.monotonic());
    }
  }

  /**
   * Fraction of the last window (or of the time since the link's first
   * transfer, when shorter) the link was busy, in [0, 1]; null until the
   * link has been in use for minSpanMs, and without a link.
   */
  utilisation(now = this.clock.monotonic()): number | null {
    if (this.measure === 'none (embedded bus, no link)') return null;
    const emulated = this.measure === 'emulated link';
    let first = emulated ? this.link.busy.firstStart : this.waits.firstStart;
    if (!emulated && this.inFlight > 0) first = Math.min(first ?? this.openedAt, this.openedAt);
    if (first === null || now - first < this.minSpanMs) return null;
    const from = Math.max(first, now - this.windowMs);
    let busy = emulated ? this.link.busy.between(from, now) : this.waits.between(from, now);
    if (!emulated && this.inFlight > 0) busy += now - Math.max(from, this.openedAt);
    return Math.min(1, Math.max(0, busy / (now - from)));
  }
}
