/**
 * bsp: every live worker takes part in every round r = 0, 1, …: it pulls
 * with `min_round r` (answered once round r-1 is applied everywhere) and
 * pushes a contribution to round r weighted by its batch size — 0 when it
 * found no batch, so the round still completes. A pause (the job's or this
 * worker's) is taken between rounds: after the round's push is accepted and
 * its batch acknowledged, before the next batch is taken. The other
 * workers' next round then waits for this one.
 *
 * Worker failover: a round expects one contribution per worker that is not
 * dead by the health actor's verdict, so the rounds go on without a dead
 * worker (the shards take the lowest count a round's contributors name). Its
 * batch comes back from the queue after ack_wait, so past the planned
 * `rounds` the loop goes on while any batch is left anywhere. A contribution
 * that arrives after its round completed without it (the round was closed by
 * a lower count) is refused; its batch goes back to the queue and is trained
 * in a later round.
 */
import { SyncRoundError } from '../shard/shard.errors.ts';
import { trainQueued, type WorkerLoopEnv } from './worker-loop.ts';

/** The explicit state of a bsp loop: the round in progress (shown as `stats.round`). */
export interface BspLoopState { round: number; rounds: number; expected: number }

export async function runBspLoop(env: WorkerLoopEnv): Promise<void> {
  const { o, control, stats, log } = env;
  const health = o.health ?? null;
  const live = () => (health === null ? o.job.workers.length : Math.max(1, o.job.workers.filter((w) => w === o.node || health.stateOf(w) !== 'dead').length));
  const s: BspLoopState = { round: 0, rounds: o.job.rounds, expected: o.job.workers.length };
  // A dead verdict while the others wait for a round: that round (and the next, if open) completes without the dead worker.
  const unwatch = health?.onChange((node, state) => {
    if (state !== 'dead' || node === o.node || !o.job.workers.includes(node)) return;
    const expected = live();
    for (const shard of env.stepper.plan.shards) {
      for (const round of [s.round - 1, s.round]) {
        if (round < 0) continue;
        env.stepper.client.lowerRound(shard, round, expected).catch((e: unknown) => log.warn({ shard, round, err: (e as Error).message }, 'could not lower a bsp round\'s expected count'));
      }
    }
  }) ?? null;
  try {
    await rounds(env, s, live);
  } finally {
    unwatch?.();
  }
}

/**
 * Batches still unacknowledged once the last round's acknowledgements have had a moment to land: the
 * other workers acknowledge their batch of the final round just after this one does, so a lone reading
 * would send this worker into an extra, empty round (and a 1.5 s wait for a batch) at every job's end.
 * A batch that stays unacknowledged (a dead worker's, back after ack_wait) is still seen.
 */
async function settledPending(env: WorkerLoopEnv, settleMs = 2_000): Promise<number> {
  const deadline = Date.now() + settleMs;
  for (;;) {
    const n = await env.o.queue.pending().catch(() => 0);
    if (n === 0 || Date.now() >= deadline || env.control.stopRequested) return n;
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function rounds(env: WorkerLoopEnv, s: BspLoopState, live: () => number): Promise<void> {
  const { o, control, stats, log } = env;
  for (; !control.stopRequested; s.round++) {
    // The planned rounds cover every batch; after a worker died, its share is trained in extra ones.
    if (s.round >= s.rounds && (await settledPending(env)) === 0) break;
    await control.atBoundary(() => stats.group);
    if (control.stopRequested) break;
    stats.round = s.round;
    const expected = live();
    if (expected !== s.expected) {
      log.warn({ round: s.round, expected, was: s.expected }, `bsp: round ${s.round} expects ${expected} contribution(s), was ${s.expected} (the health actor's verdicts)`);
      s.expected = expected;
    }
    const item = await o.queue.next(o.bspBatchWaitMs ?? 1_500);
    try {
      await trainQueued(env, item, { round: s.round, expected: s.expected });
    } catch (e) {
      if (!(e instanceof SyncRoundError)) throw e;
      // trainQueued gave the batch back already.
      log.warn({ round: s.round, err: e.message }, `bsp: round ${s.round} completed without this contribution (a worker was declared dead meanwhile); its batch goes back to the queue`);
    }
  }
}
