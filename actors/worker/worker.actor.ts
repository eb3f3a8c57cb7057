/**
 * The worker actor: one per worker node. Its training loop runs as a task
 * the actor starts; the actor itself answers `stats` and `stop`.
 *
 * Per step: take a batch descriptor from the work queue when ready (a fast
 * worker takes more), regenerate the batch, pull what it needs from the
 * shards, run the step graph, push the gradients to every owning shard, and
 * acknowledge the batch only once every push is accepted — a batch whose
 * worker dies is delivered again after ack_wait.
 *
 * Modes (training.mode):
 * - `asp`: free-running; the loop ends when every batch of the job is acknowledged.
 * - `bsp`: every worker takes part in every round r = 0..R-1: it pulls with
 *   `min_round r` (answered once round r-1 is applied everywhere), pushes a
 *   contribution to round r weighted by its batch size — 0 when it found no
 *   batch, so the round still completes.
 * - `hps`: synchronous inside the worker's group, asynchronous between
 *   groups (actors/group/group-sync.ts): the loop runs sync windows of its
 *   group's strategy and acknowledges a window's batches once the group's
 *   update of them is pushed (or refused as too stale: dropped, still
 *   acknowledged, counted in `dropped_stale_batches`).
 *
 * Emulation (`nodes.<name>.emulate`) is labelled in the logs, the stats and
 * every telemetry message (`emulated`, `emulated_speed`).
 */
import {
  ConfigError, HetpsError, type ActorContext, type ActorDefinition, type Timer,
} from '../../runtime/mod.ts';
import type { ShardPlan, WorkerGroupConfig } from '../../topology/mod.ts';
import { StepSession, type CtrModel, type DataSource, type ExecutionProvider, type MlpModel } from '../../native-bridge/mod.ts';
import type { BatchQueue, QueuedBatch } from '../store/batch-queue.ts';
import type { SparseLayout } from '../node/config-bridge.ts';
import type { JobInfo, JobInfoStore } from '../store/job-info.ts';
import { publishTelemetry, type BatchTelemetry, type DoneTelemetry, type ProgressTelemetry, type StartTelemetry } from '../monitor/telemetry.ts';
import { GroupMember, type WindowOutcome, type WindowPhases } from '../group/group-sync.ts';
import { ShardClient, StopRequestedError } from './shard-client.ts';
import { WorkerStepper, batchFromDescriptor, type SyncRound } from './step.ts';
import { workerMessages, type WorkerMessages, type WorkerStats } from './worker.messages.ts';

export interface WorkerActorOptions {
  node: string;
  group: string;
  job: JobInfo;
  plan: ShardPlan;
  queue: BatchQueue;
  source: DataSource;
  model: CtrModel | MlpModel;
  layout: SparseLayout;
  provider: ExecutionProvider;
  /** ONNX Runtime threads per operator; null = every CPU. */
  threads: number | null;
  emulateSpeed: number | null;
  /** training.emulation_reference_step_ms (default 100). */
  referenceStepMs?: number;
  /** nodes.<name>.emulate.bandwidth_mbps; null or absent: not limited. */
  bandwidthMbps?: number | null;
  /** hps: this worker's group (members, sync strategy); required in hps, ignored otherwise. */
  groupSync?: WorkerGroupConfig | null;
  /** Per request attempt to a shard. Default 10 s. */
  requestTimeoutMs?: number;
  /** How long a bsp worker looks for a batch before it contributes an empty one. Default 1.5 s. */
  bspBatchWaitMs?: number;
  /** Default 2 s. */
  progressIntervalMs?: number;
  /**
   * hps: the job info store, polled for regroups (a newer groups_version);
   * null or absent: the worker keeps its group for the whole run.
   */
  jobStore?: JobInfoStore | null;
  /** How long a paused worker waits for the driver's resume before it fails. Default 120 s. */
  regroupResumeTimeoutMs?: number;
  /** Called with each acknowledged batch's telemetry (the node's profile reporter keeps its step times). */
  onBatchTrained?: ((t: BatchTelemetry) => void) | null;
}

export type WorkerActorDefinition = ActorDefinition<WorkerMessages> & {
  /** Resolves with the final stats when the training loop has ended (done, stopped or failed). */
  readonly done: Promise<WorkerStats>;
  /** Stats now. */
  stats(): WorkerStats;
};

export function createWorkerActor(o: WorkerActorOptions): WorkerActorDefinition {
  const mode = o.job.mode;
  let groupSync = mode === 'hps' ? o.groupSync ?? null : null;
  if (mode === 'hps' && groupSync === null) throw new ConfigError(`worker ${o.node}: training.mode hps needs the worker's group (groupSync)`);
  const emulated = o.emulateSpeed !== null || (o.bandwidthMbps ?? null) !== null;
  const requestTimeoutMs = o.requestTimeoutMs ?? 10_000;
  const stats: WorkerStats = {
    node: o.node, group: o.group, state: 'starting', mode, sync_mode: groupSync?.sync_mode ?? null, windows: 0, group_state: null, lost_shard_updates: 0,
    window_phases_ms: groupSync !== null ? { steps: 0, slices: 0, round: 0, gather: 0, push: 0, reports: 0 } : null, dropped_stale_batches: 0,
    busy_ms: 0, emulated_step_ms: 0, steps: 0, samples: 0, batches_acked: 0, ack_failures: 0,
    redelivered_taken: 0, empty_rounds: 0, round: null, mean_loss: null, emulated_speed: o.emulateSpeed, emulated, error: null,
  };
  let stopRequested = false;
  let session: StepSession | null = null;
  let loop: Promise<void> | null = null;
  let resolveDone!: (s: WorkerStats) => void;
  const done = new Promise<WorkerStats>((r) => { resolveDone = r; });
  // Loss and samples since the last progress message.
  let windowLoss = 0; let windowSamples = 0; let windowSteps = 0; let windowStart = 0;
  let windowBusy = 0; let windowStepMs = 0;
  let lossSum = 0;
  let loopStart = 0;

  const run = async (ctx: ActorContext): Promise<void> => {
    const { log, clock, system } = ctx;
    const client = new ShardClient(system, { requestTimeoutMs, log, shouldStop: () => stopRequested });
    const stepper = new WorkerStepper({
      client, plan: o.plan, model: o.model, layout: o.layout, session: session!, clock, log, node: o.node,
      emulateSpeed: o.emulateSpeed, referenceStepMs: o.referenceStepMs, bandwidthMbps: o.bandwidthMbps ?? null,
    });
    const job = o.job.job;
    if (o.emulateSpeed !== null) {
      log.info({ emulated_speed: o.emulateSpeed, emulated_step_ms: stepper.pacer.targetStepMs },
        `EMULATED heterogeneity (not real hardware): every step takes ${stepper.pacer.targetStepMs!.toFixed(0)} ms `
        + `(training.emulation_reference_step_ms / nodes.${o.node}.emulate.speed ${o.emulateSpeed}), the real compute inside it`);
    }
    if ((o.bandwidthMbps ?? null) !== null) log.info({ bandwidth_mbps: o.bandwidthMbps }, `EMULATED link: ${o.bandwidthMbps} Mbit/s for pulls, pushes and group slices (nodes.${o.node}.emulate.bandwidth_mbps)`);
    if (groupSync !== null) {
      log.info({ group: groupSync.name, sync_mode: groupSync.sync_mode, members: groupSync.nodes },
        `hps: ${groupSync.sync_mode} inside group ${groupSync.name} (${groupSync.nodes.join(', ')}), asynchronous between groups`);
    }
    windowStart = clock.monotonic();
    loopStart = windowStart;
    const start: StartTelemetry = {
      node: o.node, group: o.group, mode, emulated_speed: o.emulateSpeed, emulated, sync_mode: groupSync?.sync_mode ?? null,
      emulated_step_target_ms: stepper.pacer.targetStepMs,
    };
    publishTelemetry(system.transport, job, 'start', o.node, start);
    const progress = clock.setInterval(() => {
      const now = clock.monotonic();
      const body: ProgressTelemetry = {
        node: o.node, group: o.group, steps: stats.steps, samples: stats.samples,
        loss: windowSamples > 0 ? windowLoss / windowSamples : null,
        samples_per_s: now > windowStart ? (windowSamples * 1000) / (now - windowStart) : 0,
        round: stats.round, emulated_speed: o.emulateSpeed, emulated,
        busy_ms: windowBusy, emulated_step_ms: windowStepMs, window_ms: Math.max(0, now - windowStart),
      };
      publishTelemetry(system.transport, job, 'progress', o.node, body);
      windowLoss = 0; windowSamples = 0; windowSteps = 0; windowStart = now; windowBusy = 0; windowStepMs = 0;
    }, o.progressIntervalMs ?? 2_000);

    /** Counts a trained batch and reports it once acknowledged. */
    const account = async (item: QueuedBatch, t: { loss: number; samples: number; computeMs: number; stepMs: number; staleness: number; droppedStale: boolean; round: number | null; window: number | null }) => {
      const confirmed = await item.ack();
      stats.steps++; stats.samples += t.samples;
      stats.busy_ms += t.computeMs; stats.emulated_step_ms += t.stepMs;
      windowSteps++; windowSamples += t.samples; windowLoss += t.loss * t.samples; lossSum += t.loss * t.samples;
      windowBusy += t.computeMs; windowStepMs += t.stepMs;
      stats.mean_loss = lossSum / stats.samples;
      if (t.droppedStale) stats.dropped_stale_batches++;
      if (confirmed) stats.batches_acked++;
      else {
        stats.ack_failures++;
        log.warn({ batch: item.desc.batch_id }, 'the queue did not confirm the acknowledgement (the delivery had expired): the batch may be trained again');
      }
      const tel: BatchTelemetry = {
        node: o.node, batch_id: item.desc.batch_id, samples: t.samples, loss: t.loss, redelivered: item.redelivered,
        ack_confirmed: confirmed, staleness: t.staleness, round: t.round, busy_ms: t.computeMs, emulated_step_ms: t.stepMs,
        dropped_stale: t.droppedStale, window: t.window, group: groupSync?.name ?? null,
      };
      publishTelemetry(system.transport, job, 'batch', o.node, tel);
      o.onBatchTrained?.(tel);
    };

    const step = async (item: QueuedBatch | null, sync: SyncRound | null): Promise<void> => {
      // A long bsp wait must not let the batch's ack_wait run out while this worker still holds it.
      let keepAlive: Timer | null = null;
      if (item !== null) {
        if (item.redelivered) stats.redelivered_taken++;
        keepAlive = clock.setInterval(() => item.working(), Math.max(500, Math.floor(o.job.ack_wait_ms / 3)));
      }
      try {
        const batch = item === null ? null : batchFromDescriptor(o.source, item.desc);
        const out = await stepper.run(batch, sync);
        keepAlive?.cancel();
        if (item === null || out.loss === null) { stats.empty_rounds++; return; }
        await account(item, {
          loss: out.loss, samples: out.samples, computeMs: out.computeMs, stepMs: out.stepMs, staleness: out.staleness,
          droppedStale: out.droppedStale, round: sync?.round ?? null, window: null,
        });
      } catch (e) {
        keepAlive?.cancel();
        // Give the batch back at once rather than after ack_wait.
        item?.nak();
        throw e;
      }
    };

    /**
     * hps: the next window's first batch, fetched while this window's group
     * exchange runs (not held by this window: it is acknowledged with the
     * window that trains it, or given back when training stops or pauses).
     */
    let carried: Promise<QueuedBatch | null> | null = null;
    /** The carried batch once it arrived: kept alive with the window's own (a group exchange may wait longer than ack_wait). */
    let carriedItem: QueuedBatch | null = null;
    const giveBackCarried = async () => {
      const c = carried;
      carried = null;
      carriedItem = null;
      const item = c === null ? null : await c.catch(() => null);
      item?.nak();
    };

    /** hps: one sync window of the group's strategy; the batches taken are acknowledged once the group's update of them is out. */
    const hpsWindow = async (member: GroupMember): Promise<WindowOutcome> => {
      const held: QueuedBatch[] = [];
      const keepAlive = clock.setInterval(() => { for (const h of held) h.working(); carriedItem?.working(); }, Math.max(500, Math.floor(o.job.ack_wait_ms / 3)));
      let outcome: WindowOutcome;
      try {
        outcome = await member.runWindow({
          next: async () => {
            if (stopRequested) return null;
            const ahead = carried;
            carried = null;
            carriedItem = null;
            const item = ahead !== null ? await ahead : await o.queue.next(1_000);
            if (item === null) return null;
            held.push(item);
            if (item.redelivered) stats.redelivered_taken++;
            return batchFromDescriptor(o.source, item.desc);
          },
          // Nothing waiting and nothing in flight anywhere (a dead worker's batch comes back after ack_wait).
          drained: async () => (await o.queue.pending().catch(() => 1)) === 0,
          prefetch: () => {
            if (stopRequested || carried !== null) return;
            const fetching: Promise<QueuedBatch | null> = o.queue.next(1_000).then((item) => { if (carried === fetching) carriedItem = item; return item; });
            carried = fetching;
          },
        });
      } catch (e) {
        keepAlive.cancel();
        for (const h of held) h.nak();
        throw e;
      }
      keepAlive.cancel();
      stats.windows++;
      stats.lost_shard_updates += outcome.lostShards.length;
      const sums = stats.window_phases_ms;
      if (sums !== null) for (const k of Object.keys(sums) as (keyof WindowPhases)[]) sums[k] += outcome.phases[k];
      stats.round = null;
      await Promise.all(held.map((item, i) => {
        const s = outcome.steps[i]!;
        return account(item, {
          loss: s.loss, samples: s.samples, computeMs: s.computeMs, stepMs: s.stepMs, staleness: outcome.staleness,
          droppedStale: outcome.droppedStale, round: null, window: outcome.window,
        });
      }));
      return outcome;
    };

    /** Polls the job info until the driver resumes `version` (or a later one); fails loudly after the timeout. */
    const waitForResume = async (c: ActorContext, store: JobInfoStore, version: number): Promise<JobInfo> => {
      const started = c.clock.monotonic();
      let lastNote = started;
      const limit = o.regroupResumeTimeoutMs ?? 120_000;
      for (;;) {
        if (stopRequested) throw new StopRequestedError(`stopped while paused for regroup v${version}`);
        const info = await store.get().catch(() => null);
        if (info !== null && info.run_id === o.job.run_id && info.resume_version >= version) return info;
        const now = c.clock.monotonic();
        if (now - started >= limit) throw new HetpsError(`regroup v${version}: the driver did not resume training within ${Math.round(limit / 1000)} s`);
        if (now - lastNote >= 10_000) {
          lastNote = now;
          c.log.warn({ groups_version: version, waited_s: Math.round((now - started) / 1000) }, `paused for regroup v${version}: still waiting for the driver's resume`);
        }
        await c.clock.sleep(100);
      }
    };

    try {
      stats.state = 'training';
      if (groupSync !== null) {
        // Regrouping: the job info is polled in the background; a newer groups_version pauses this worker at a window boundary.
        let version = o.job.groups_version;
        let seen = version;
        const store = o.jobStore ?? null;
        const poll = store === null ? null : clock.setInterval(() => {
          void store.get().then((i) => { if (i !== null && i.run_id === o.job.run_id && i.groups_version > seen) seen = i.groups_version; }, () => undefined);
        }, 500);
        try {
          for (;;) {
            const g: WorkerGroupConfig = groupSync;
            // The run id carries the groups version: a late message of the old membership never reaches the new one.
            const member = new GroupMember({
              system, group: g, member: o.node, runId: version === 0 ? o.job.run_id : `${o.job.run_id}/g${version}`, plan: o.plan, stepper, log,
              shouldStop: () => stopRequested, requestTimeoutMs, groupsVersionSeen: () => seen,
              // A silent member is waited for as long as its batches are (fault_tolerance.worker_recovery_timeout).
              recoveryTimeoutMs: o.job.ack_wait_ms,
              // Silent for half of it (at most 10 s): reported lost, so the recovery timeout starts.
              lostAfterMs: Math.min(10_000, Math.max(500, Math.floor(o.job.ack_wait_ms / 2))),
              onState: (st) => { stats.group_state = st; },
            });
            await member.start();
            let pauseFor: number | null = null;
            try {
              while (!stopRequested) {
                const outcome = await hpsWindow(member);
                if (outcome.done) break;
                if (outcome.groupsVersion > version && store !== null) { pauseFor = outcome.groupsVersion; break; }
              }
              if (pauseFor !== null) member.regroup(`groups v${pauseFor}`);
            } finally {
              await giveBackCarried();
              await member.stop(pauseFor !== null ? 'regrouped' : 'stopped');
            }
            if (pauseFor === null || stopRequested || store === null) break;
            // Paused: every batch of the last window is pushed and acknowledged; nothing is held.
            log.info({ groups_version: pauseFor, group: g.name }, `regroup to groups v${pauseFor}: paused after window ${member.window - 1} of group ${g.name}; waiting for the driver's resume`);
            publishTelemetry(system.transport, job, 'regroup', o.node, { node: o.node, groups_version: pauseFor, state: 'ready', group: g.name });
            const info = await waitForResume(ctx, store, pauseFor);
            const next = (info.groups ?? []).find((x) => x.nodes.includes(o.node));
            if (next === undefined) throw new HetpsError(`regroup v${info.groups_version}: ${o.node} is in none of the new groups`);
            groupSync = next;
            // A regroup after this one (if any) pauses this worker again after its next window.
            version = info.resume_version;
            if (seen < version) seen = version;
            stats.group = next.name;
            stats.sync_mode = next.sync_mode;
            log.info({ groups_version: version, group: next.name, sync_mode: next.sync_mode, members: next.nodes },
              `regrouped (groups v${version}): now ${next.sync_mode} inside group ${next.name} (${next.nodes.join(', ')}); the next window pulls fresh parameters`);
            publishTelemetry(system.transport, job, 'regroup', o.node, { node: o.node, groups_version: version, state: 'resumed', group: next.name });
          }
        } finally {
          poll?.cancel();
        }
      } else if (mode === 'bsp') {
        const expected = o.job.workers.length;
        for (let r = 0; r < o.job.rounds && !stopRequested; r++) {
          stats.round = r;
          const item = await o.queue.next(o.bspBatchWaitMs ?? 1_500);
          await step(item, { round: r, expected });
        }
      } else {
        while (!stopRequested) {
          const item = await o.queue.next(1_000);
          if (item === null) {
            // Empty for now: done once nothing is in flight anywhere (a dead worker's batch comes back after ack_wait).
            if ((await o.queue.pending().catch(() => 1)) === 0) break;
            continue;
          }
          await step(item, null);
        }
      }
      stats.state = stopRequested ? 'stopped' : 'done';
    } catch (e) {
      if (e instanceof StopRequestedError) stats.state = 'stopped';
      else {
        stats.state = 'failed';
        stats.error = (e as Error).message;
        log.error({ err: e }, 'training loop failed');
      }
    } finally {
      progress.cancel();
      const body: DoneTelemetry = {
        node: o.node, steps: stats.steps, samples: stats.samples, batches_acked: stats.batches_acked, empty_rounds: stats.empty_rounds, reason: stats.state,
        busy_ms: stats.busy_ms, emulated_step_ms: stats.emulated_step_ms, wall_ms: Math.max(0, clock.monotonic() - loopStart),
        emulated, emulated_speed: o.emulateSpeed, dropped_stale_batches: stats.dropped_stale_batches, windows: stats.windows,
        window_phases_ms: stats.window_phases_ms === null ? null : { ...stats.window_phases_ms },
      };
      publishTelemetry(system.transport, job, 'done', o.node, body);
      log.info({
        steps: stats.steps, samples: stats.samples, acked: stats.batches_acked, state: stats.state,
        ...(groupSync !== null ? { windows: stats.windows, dropped_stale_batches: stats.dropped_stale_batches } : {}),
        ...(emulated ? { emulated: true, emulated_speed: o.emulateSpeed } : {}),
      }, 'training loop ended');
      resolveDone({ ...stats });
    }
  };

  return {
    kind: 'worker',
    id: o.node,
    messages: workerMessages,
    done,
    stats: () => ({ ...stats }),
    async onStart(ctx) {
      session = await StepSession.create(o.model, { provider: o.provider, intraOpNumThreads: o.threads, graph: 'step' });
      loop = run(ctx);
    },
    async onStop() {
      stopRequested = true;
      await loop;
      await session?.dispose();
      session = null;
    },
    handlers: {
      stats: () => ({ ...stats }),
      stop: (m, ctx) => {
        if (!stopRequested) ctx.log.info({ reason: m.reason }, 'stop requested');
        stopRequested = true;
        return { stopping: true, state: stats.state };
      },
    },
  };
}
