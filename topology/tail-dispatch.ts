/**
 * Tail dispatch (`training.tail_dispatch`): the job's last batches go to the
 * workers that finish them first.
 *
 * Workers take batches from one queue as they become free, so near the end
 * a slow worker takes one of the last batches while faster workers are about
 * to run out of work. The job then waits for that batch — a speed-0.2 node
 * holds the end of a run for a whole step of its own while every other node
 * idles — and its push, a single stale batch at the full rate, is the last
 * update the model gets (measured on bench:hetero's cluster: the last batch of
 * a slow async node arrived 4.5–5 s after the rest and moved the test loss by
 * +0.01 to +0.03).
 *
 * The rule, per take: a worker leaves the queue's next batch to the faster
 * workers when they would take every other batch still waiting before it
 * finished that one: when
 *
 *     undelivered − 1 < Σ rate(faster workers) · (1 / own rate)
 *
 * "Faster" is at least `FASTER_BY` × this worker's rate, so equally fast
 * workers never wait for each other, and the fastest workers always take.
 * Rates are batches per second as each worker's progress telemetry reports
 * them (the actor side measures them; this is the policy only).
 */

/** A worker counts as faster than another when its rate is at least this many times the other's. */
export const TAIL_FASTER_BY = 1.25;

export interface TailView {
  /** Batches in the queue not yet handed to any worker. */
  undelivered: number;
  /** This worker's measured batches per second; ≤ 0 or not finite: unknown (it takes). */
  ownRate: number;
  /** The measured batches per second of every other worker training now. */
  peerRates: readonly number[];
}

export interface TailDecision {
  take: boolean;
  /** Batches the faster workers finish in the time this worker takes for one (0: no faster worker). */
  fasterCapacity: number;
  /** How many of the peers are faster. */
  faster: number;
}

export function tailDecision(v: TailView): TailDecision {
  if (!(v.ownRate > 0) || !Number.isFinite(v.ownRate)) return { take: true, fasterCapacity: 0, faster: 0 };
  let sum = 0;
  let faster = 0;
  for (const r of v.peerRates) {
    if (Number.isFinite(r) && r >= TAIL_FASTER_BY * v.ownRate) { sum += r; faster++; }
  }
  const fasterCapacity = sum / v.ownRate;
  return { take: faster === 0 || v.undelivered - 1 >= fasterCapacity, fasterCapacity, faster };
}
