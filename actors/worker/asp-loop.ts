/**
 * asp: free-running. Each step takes the next batch from the queue, trains
 * it and acknowledges it once every push is accepted. A pause (the job's or
 * this worker's) is taken between two batches, holding none. The loop ends
 * when the queue is empty and nothing is in flight anywhere. With
 * training.tail_dispatch a worker leaves the last batches to faster workers
 * that would take them all before it finished one (tail-gate.ts).
 */
import { TAIL_RECHECK_MS } from './tail-gate.ts';
import { trainQueued, type WorkerLoopEnv } from './worker-loop.ts';

/** How long one look at the queue waits before the loop checks whether the job is drained. */
const ASP_TAKE_WAIT_MS = 1_000;

export async function runAspLoop(env: WorkerLoopEnv): Promise<void> {
  const { o, control, stats } = env;
  while (!control.stopRequested) {
    await control.atBoundary(() => stats.group);
    if (control.stopRequested) break;
    if (env.tail !== null && !(await env.tail.allows())) {
      // Faster workers take the last batches (training.tail_dispatch); done once the queue is drained.
      if ((await o.queue.pending().catch(() => 1)) === 0) break;
      await env.clock.sleep(TAIL_RECHECK_MS);
      continue;
    }
    const item = await o.queue.next(ASP_TAKE_WAIT_MS);
    if (item === null) {
      // Empty for now: done once nothing is in flight anywhere (a dead worker's batch comes back after ack_wait).
      if ((await o.queue.pending().catch(() => 1)) === 0) break;
      continue;
    }
    await trainQueued(env, item, null);
  }
}
