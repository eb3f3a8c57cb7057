/**
 * When to take a checkpoint's cut in hps: at a moment when every worker is
 * stepping, not exchanging.
 *
 * A pause reaches a worker either while it steps (it drops the step and its
 * window's unsent steps, and is paused within a few milliseconds) or while
 * its group exchanges a window (slices out, a push in flight: that must
 * finish, and on a busy cluster it takes hundreds of milliseconds). A worker
 * starts stepping right after its window boundary (its batches are
 * acknowledged and reported then), so the early part of its cycle, a
 * `fraction` of its period after the boundary, is stepping. The cut waits for
 * a moment where that holds for every active worker, at most `maxWaitMs`.
 *
 * Per worker, not per group: a sync group's members share their boundaries,
 * and the members of an async group each have their own.
 */

export interface WorkerCadence {
  /** Monotonic ms of the worker's last window boundary. */
  lastBoundaryMs: number;
  /** Smoothed ms between its boundaries; null until two were seen. */
  periodMs: number | null;
}

export interface CutMomentPolicy {
  /** The part of a worker's cycle after its boundary taken as stepping. Default 0.25. */
  fraction: number;
  /** A worker with no boundary for this many periods is not training (paused, done, stalled) and does not hold the cut back. Default 2. */
  idleAfterPeriods: number;
}

export const DEFAULT_CUT_MOMENT: CutMomentPolicy = { fraction: 0.25, idleAfterPeriods: 2 };

/** The workers that hold a cut back at `now`: active ones with a known period, outside the stepping part of their cycle. */
export function workersExchanging(now: number, cadences: ReadonlyMap<string, WorkerCadence>, policy: CutMomentPolicy = DEFAULT_CUT_MOMENT): string[] {
  checkPolicy(policy);
  const out: string[] = [];
  for (const [node, c] of cadences) {
    if (active(now, c, policy) && now - c.lastBoundaryMs > policy.fraction * c.periodMs!) out.push(node);
  }
  return out.sort();
}

/** How long a cut may wait for its moment: two of the longest active period, at most `capMs` (0 when no worker has a known cadence). */
export function cutMomentWaitMs(now: number, cadences: ReadonlyMap<string, WorkerCadence>, capMs: number, policy: CutMomentPolicy = DEFAULT_CUT_MOMENT): number {
  checkPolicy(policy);
  let longest = 0;
  for (const c of cadences.values()) if (active(now, c, policy)) longest = Math.max(longest, c.periodMs!);
  return Math.max(0, Math.min(capMs, 2 * longest));
}

/** Ms until the next active worker goes idle (stops holding a cut back); Infinity when none will. */
export function msUntilNextIdle(now: number, cadences: ReadonlyMap<string, WorkerCadence>, policy: CutMomentPolicy = DEFAULT_CUT_MOMENT): number {
  let next = Infinity;
  for (const c of cadences.values()) {
    if (active(now, c, policy)) next = Math.min(next, c.lastBoundaryMs + policy.idleAfterPeriods * c.periodMs! - now + 1);
  }
  return next;
}

/** A worker with a known period that had a boundary within `idleAfterPeriods` of them. */
function active(now: number, c: WorkerCadence, policy: CutMomentPolicy): boolean {
  return c.periodMs !== null && now - c.lastBoundaryMs <= policy.idleAfterPeriods * c.periodMs;
}

/**
 * The cadence after a boundary at `now`: the period smoothed over the
 * intervals (weight `alpha` for the newest), where an interval over three
 * periods (a pause, a regroup) restarts the estimate instead of inflating it.
 */
export function nextCadence(prev: WorkerCadence | undefined, now: number, alpha = 0.3): WorkerCadence {
  if (!(alpha > 0 && alpha <= 1)) throw new RangeError(`cut moment: alpha must be in (0, 1], got ${alpha}`);
  if (prev === undefined) return { lastBoundaryMs: now, periodMs: null };
  const interval = now - prev.lastBoundaryMs;
  if (!(interval >= 0)) return { lastBoundaryMs: now, periodMs: prev.periodMs };
  if (prev.periodMs === null) return { lastBoundaryMs: now, periodMs: interval };
  if (interval > 3 * prev.periodMs) return { lastBoundaryMs: now, periodMs: null };
  return { lastBoundaryMs: now, periodMs: (1 - alpha) * prev.periodMs + alpha * interval };
}

function checkPolicy(p: CutMomentPolicy): void {
  if (!(p.fraction > 0 && p.fraction < 1)) throw new RangeError(`cut moment: fraction must be in (0, 1), got ${p.fraction}`);
  if (!(p.idleAfterPeriods >= 1)) throw new RangeError(`cut moment: idleAfterPeriods must be ≥ 1, got ${p.idleAfterPeriods}`);
}
