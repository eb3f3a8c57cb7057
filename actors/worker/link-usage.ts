/**
 * How busy a worker's link has been lately: what adaptive gradient
 * compression decides on (topology/compression.ts says what utilisation
 * means and how it is measured with and without an emulated link).
 */
import { LINK_UTILISATION_MIN_SPAN_MS, LINK_UTILISATION_WINDOW_MS } from '../../topology/mod.ts';
import { HetpsError, type Clock } from '../../runtime/mod.ts';
import { EmulatedLink } from './emulation.ts';

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
  /**
   * The bandwidth of the worker's own link to its NATS server as its profile
   * measured it when it joined (actors/node/node-profile.ts); null or
   * absent: not measured (the waits are the measure then).
   */
  measuredMbps?: number | null;
  /** Default LINK_UTILISATION_WINDOW_MS. */
  windowMs?: number;
  /** Default LINK_UTILISATION_MIN_SPAN_MS. */
  minSpanMs?: number;
}

/** What a worker's link utilisation is measured from. */
export type LinkMeasure = 'emulated link' | 'bytes over the measured bandwidth' | 'waits on pulls, pushes and slices' | 'none (embedded bus, no link)';

/**
 * The worker's link utilisation, from the first of these that applies:
 * - an emulated link (a bandwidth set): the emulated link's busy time, exact;
 * - over NATS with the link's bandwidth measured (the worker's profile): the
 *   time its bytes take at that bandwidth (pulls both ways, pushes and the
 *   group slices it sends: what an emulated link would charge), queued one
 *   after another as on the emulated link (`carried`) — the link's own
 *   share of each request, without the receiver's handling;
 * - over NATS without a measured bandwidth: the time the worker has requests
 *   in flight that `waitOn` wraps (pulls, pushes, group-slice sends),
 *   overlapping requests counted once — an upper bound, which counts a
 *   busy shard's handling as link time too;
 * - on the embedded bus without an emulated link there is no link: never
 *   measured (null), so adaptive compression keeps float32 (waits there are
 *   other nodes' compute on the same event loop, not transfers).
 */
export class LinkUsage {
  private readonly waits: BusyIntervals;
  private inFlight = 0;
  private openedAt = 0;
  private readonly windowMs: number;
  private readonly minSpanMs: number;
  readonly measure: LinkMeasure;

  /** The link modelled at its measured bandwidth: records busy time, holds nothing; null unless that is the measure. */
  private readonly modelled: EmulatedLink | null;

  constructor(private readonly clock: Clock, private readonly link: EmulatedLink, o: LinkUsageOptions) {
    this.windowMs = o.windowMs ?? LINK_UTILISATION_WINDOW_MS;
    this.minSpanMs = o.minSpanMs ?? LINK_UTILISATION_MIN_SPAN_MS;
    this.waits = new BusyIntervals(this.windowMs);
    const measured = o.measuredMbps ?? null;
    if (measured !== null && !(Number.isFinite(measured) && measured > 0)) throw new HetpsError(`measured link bandwidth must be a positive number of Mbit/s, got ${measured}`);
    this.measure = link.bandwidthMbps !== null ? 'emulated link'
      : !o.network ? 'none (embedded bus, no link)'
        : measured !== null ? 'bytes over the measured bandwidth' : 'waits on pulls, pushes and slices';
    this.modelled = this.measure === 'bytes over the measured bandwidth' ? new EmulatedLink(clock, measured, this.windowMs) : null;
  }

  /** `bytes` crossed the link just now (sent, or a reply received): busy time at the measured bandwidth, when that is the measure. */
  carried(bytes: number): void {
    this.modelled?.occupy(bytes);
  }

  /** Runs `request`, counting the time it is in flight as link time (when waits are the measure). */
  async waitOn<T>(request: () => Promise<T>): Promise<T> {
    if (this.measure !== 'waits on pulls, pushes and slices') return request();
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
    const waits = this.measure === 'waits on pulls, pushes and slices';
    const busyTime = waits ? this.waits : (this.modelled ?? this.link).busy;
    let first = busyTime.firstStart;
    if (waits && this.inFlight > 0) first = Math.min(first ?? this.openedAt, this.openedAt);
    if (first === null || now - first < this.minSpanMs) return null;
    const from = Math.max(first, now - this.windowMs);
    let busy = busyTime.between(from, now);
    if (waits && this.inFlight > 0) busy += now - Math.max(from, this.openedAt);
    return Math.min(1, Math.max(0, busy / (now - from)));
  }
}
