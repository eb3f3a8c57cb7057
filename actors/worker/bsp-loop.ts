/**
 * bsp: every worker takes part in every round r = 0..R-1: it pulls with
 * `min_round r` (answered once round r-1 is applied everywhere) and pushes a
 * contribution to round r weighted by its batch size — 0 when it found no
 * batch, so the round still completes. A pause (the job's or this worker's)
 * is taken between rounds: after the round's push is accepted and its batch
 * acknowledged, before the next batch is taken. The other workers' next
 * round then waits for this one.
 */
import { trainQueued, type WorkerLoopEnv } from './worker-loop.ts';

/** The explicit state of a bsp loop: the round in progress (shown as `stats.round`). */
export interface BspLoopState { round: number; rounds: number; expected: number }

export async function runBspLoop(env: WorkerLoopEnv): Promise<void> {
  const { o, control, stats } = env;
  const s: BspLoopState = { round: 0, rounds: o.job.rounds, expected: o.job.workers.length };
  for (; s.round < s.rounds && !control.stopRequested; s.round++) {
    await control.atBoundary(() => stats.group);
    if (control.stopRequested) break;
    stats.round = s.round;
    const item = await o.queue.next(o.bspBatchWaitMs ?? 1_500);
    await trainQueued(env, item, { round: s.round, expected: s.expected });
  }
}
