/**
 * hps: synchronous inside the worker's group, asynchronous between groups
 * (actors/group/group-sync.ts). The loop runs sync windows of its group's
 * strategy and acknowledges a window's batches once the group's update of
 * them is pushed (or refused as too stale: dropped, still acknowledged,
 * counted in `dropped_stale_batches`).
 *
 * Pauses are taken at window boundaries:
 * - the job's (a regroup): the group agrees on the boundary through its
 *   slices (`WindowOutcome.groupsVersion`); the member is stopped, the
 *   worker reports ready, and once resumed it re-forms its member from the
 *   job info's groups;
 * - this worker's own (mailbox `pause`): the member stays in its group,
 *   which waits for it (its round cannot start without it);
 * - taken back into its group (job info `rejoining`): the group dropped this
 *   worker as dead (a cut link, a stopped process) and it is alive again.
 *   The peers no longer wait for it, so it gives up the window it is stuck
 *   in (its batches go back to the queue), pauses, and re-forms with its
 *   group on the resume: a fresh pull, then synchronous rounds again.
 */
import { HetpsError } from '../../runtime/mod.ts';
import type { WorkerGroupConfig } from '../../topology/mod.ts';
import type { QueuedBatch } from '../store/batch-queue.ts';
import { GroupMember, WindowAbandonedError, type WindowOutcome, type WindowPhases } from '../group/group-sync.ts';
import { batchFromDescriptor } from './step.ts';
import { trainQueued, type WorkerLoopEnv } from './worker-loop.ts';
import { TAIL_RECHECK_MS } from './tail-gate.ts';

/** A window's phases in whole milliseconds, for the log. */
function roundPhases(p: WindowPhases): WindowPhases {
  return Object.fromEntries(Object.entries(p).map(([k, v]) => [k, Math.round(v)])) as unknown as WindowPhases;
}

/** How long a window waits for its next batch before it closes with what it has. */
const HPS_TAKE_WAIT_MS = 1_000;

export class HpsLoop {
  /** The group the worker trains in (changes on regroup). */
  private group: WorkerGroupConfig;
  /**
   * The next window's first batch, fetched while this window's group
   * exchange runs (not held by this window: it is acknowledged with the
   * window that trains it, or given back when training stops or pauses).
   */
  private carried: Promise<QueuedBatch | null> | null = null;
  /** The carried batch once it arrived: kept alive with the window's own (a group exchange may wait longer than ack_wait). */
  private carriedItem: QueuedBatch | null = null;

  constructor(private readonly env: WorkerLoopEnv, group: WorkerGroupConfig) {
    this.group = group;
  }

  /** The group batches are trained in now. */
  get groupName(): string { return this.group.name; }

  async run(): Promise<void> {
    const { control, log } = this.env;
    for (;;) {
      const g = this.group;
      const version = control.groupsVersion;
      const member = this.member(g, version);
      await member.start();
      let pauseFor: number | null = null;
      let lastWindow: { steps: number; phases_ms: WindowPhases } | null = null;
      try {
        while (!control.stopRequested) {
          if (control.pauseRequested) {
            this.giveBackCarried();
            await control.hold();
            if (control.stopRequested) break;
            if (control.jobPausePending) { pauseFor = control.seen; break; }
          }
          let outcome: WindowOutcome;
          try {
            outcome = await this.window(member);
          } catch (e) {
            if (!(e instanceof WindowAbandonedError) || control.stopRequested) throw e;
            // Taken back after the group dropped this worker (a healed link): nothing of the window was acknowledged.
            log.warn({ groups_version: control.seen, group: g.name, window: member.window }, `${e.message}; its batches went back to the queue`);
            pauseFor = control.seen;
            break;
          }
          if (outcome.done) break;
          if (outcome.groupsVersion > version && control.followsJob) { pauseFor = outcome.groupsVersion; lastWindow = { steps: outcome.steps.length, phases_ms: outcome.phases }; break; }
        }
        if (pauseFor !== null) member.regroup(`groups v${pauseFor}`);
      } finally {
        this.giveBackCarried();
        await member.stop(pauseFor !== null ? 'regrouped' : 'stopped');
      }
      if (pauseFor === null || control.stopRequested) break;
      // Paused: every batch of the last window is pushed and acknowledged; nothing is held.
      log.info({ groups_version: pauseFor, group: g.name, last_window: lastWindow, pausing_ms: control.sinceNoticedMs },
        `regroup to groups v${pauseFor}: paused after window ${member.window - 1} of group ${g.name}; waiting for the driver's resume`);
      let info = await control.pauseForJob(pauseFor, g.name);
      if (!info.workers.includes(this.env.o.node) && info.standbys.includes(this.env.o.node)) {
        log.warn({ groups_version: info.groups_version }, `${this.env.o.node} is a standby now (its place went to a standby while it was dead by the health verdicts): waiting to take a place again`);
        info = await control.waitForPlace();
      }
      const next = (info.groups ?? []).find((x) => x.nodes.includes(this.env.o.node));
      if (next === undefined) throw new HetpsError(`regroup v${info.groups_version}: ${this.env.o.node} is in none of the new groups`);
      this.group = next;
      this.env.stats.group = next.name;
      this.env.stats.sync_mode = next.sync_mode;
      log.info({ groups_version: info.resume_version, group: next.name, sync_mode: next.sync_mode, members: next.nodes },
        `regrouped (groups v${info.resume_version}): now ${next.sync_mode} inside group ${next.name} (${next.nodes.join(', ')}); the next window pulls fresh parameters`);
      // A regroup after this one (if any) pauses this worker again after its next window.
      control.resumedUnder(info, next.name);
    }
  }

  /** The worker's member of group `g`; the run id carries the groups version, so a late message of the old membership never reaches the new one. */
  private member(g: WorkerGroupConfig, version: number): GroupMember {
    const { o, stats, control, stepper, system, log, requestTimeoutMs } = this.env;
    return new GroupMember({
      system, group: g, member: o.node, runId: version === 0 ? o.job.run_id : `${o.job.run_id}/g${version}`, plan: o.plan, stepper, log,
      shouldStop: () => control.stopRequested, requestTimeoutMs, groupsVersionSeen: () => control.seen,
      // The job is pausing (a checkpoint's cut, ctl.pause, a regroup): end the window after the step in progress, so the pause waits for one step, not a whole window.
      closeEarly: () => control.jobPausePending,
      // It turns true only with a job-info write, which wakes the control's waiters: no polling while stepping.
      closeEarlyChanged: (ms) => control.nextChange(ms),
      // And the window's steps are dropped when the member has not sent them yet: its batches go back to the queue below.
      discardOnPause: true,
      groupLr: o.groupLr ?? null,
      streamSlices: o.streamSlices ?? false,
      directPush: o.directPush ?? false,
      // A silent member that is not dead is waited for this long (fault_tolerance.worker_recovery_timeout); a dead one leaves at once.
      recoveryTimeoutMs: o.job.recovery_timeout_ms ?? o.job.ack_wait_ms,
      // Without health verdicts: silent for half of it (at most 10 s) is reported lost, so the recovery timeout starts.
      lostAfterMs: Math.min(10_000, Math.max(500, Math.floor((o.job.recovery_timeout_ms ?? o.job.ack_wait_ms) / 2))),
      onState: (st) => { stats.group_state = st; },
      health: o.health ?? null,
      abandon: () => (control.rejoinPending ? `the driver takes ${o.node} back into group ${g.name} (groups v${control.seen}) after the group dropped it`
        : control.replacedPending ? `a standby took ${o.node}'s place in group ${g.name} (groups v${control.seen}) while it was dead by the health verdicts` : null),
    });
  }

  /** One sync window of the group's strategy; the batches taken are acknowledged once the group's update of them is out. */
  private async window(member: GroupMember): Promise<WindowOutcome> {
    const { o, stats, control, ledger, log } = this.env;
    const held: QueuedBatch[] = [];
    // Batches handed out again (their worker died unacknowledged): part of their update may be on
    // the shards already, so each is trained alone after the window, and every shard that applied
    // it answers without applying it again (the shards' applied-batch log).
    const solo: QueuedBatch[] = [];
    const keepAlive = ledger.keepAlive(() => [...held, ...solo, this.carriedItem]);
    // Until runWindow returns: a batch that arrives after it (the window ended without waiting for it, for a pause) goes straight back.
    let open = true;
    let outcome: WindowOutcome;
    try {
      outcome = await member.runWindow({
        next: async () => {
          if (control.stopRequested) return null;
          if (this.carried === null && this.env.tail !== null && !(await this.env.tail.allows())) {
            // Faster workers take the last batches (training.tail_dispatch): the window closes with what it has.
            await this.env.clock.sleep(TAIL_RECHECK_MS);
            return null;
          }
          const ahead = this.carried;
          this.carried = null;
          this.carriedItem = null;
          let item = ahead !== null ? await ahead : await o.queue.next(HPS_TAKE_WAIT_MS);
          while (item !== null && item.redelivered && open) {
            solo.push(item);
            item = control.stopRequested ? null : await o.queue.next(HPS_TAKE_WAIT_MS);
          }
          if (item === null) return null;
          if (!open) { item.nak(); return null; }
          held.push(item);
          return batchFromDescriptor(o.source, item.desc);
        },
        // Nothing waiting and nothing in flight anywhere (a dead worker's batch comes back after ack_wait).
        drained: async () => (await o.queue.pending().catch(() => 1)) === 0,
        prefetch: () => {
          if (control.stopRequested || this.carried !== null) return;
          // Near the end a batch fetched ahead could be one the tail dispatch leaves to faster workers.
          if (this.env.tail?.mayDecline() === true) return;
          const fetching: Promise<QueuedBatch | null> = o.queue.next(HPS_TAKE_WAIT_MS).then((item) => { if (this.carried === fetching) this.carriedItem = item; return item; });
          this.carried = fetching;
        },
      });
    } catch (e) {
      open = false;
      keepAlive.cancel();
      for (const h of [...held, ...solo]) h.nak();
      throw e;
    }
    open = false;
    keepAlive.cancel();
    stats.windows++;
    stats.lost_shard_updates += outcome.lostShards.length;
    log.debug({ window: outcome.window, steps: outcome.steps.length, phases_ms: roundPhases(outcome.phases) },
      `window ${outcome.window} of group ${this.group.name}: ${outcome.steps.length} step(s) exchanged and pushed`);
    const sums = stats.window_phases_ms;
    if (sums !== null) for (const k of Object.keys(sums) as (keyof WindowPhases)[]) sums[k] += outcome.phases[k];
    stats.round = null;
    if (outcome.discarded > 0) {
      // Dropped for a pause (discardOnPause): none of them reached a shard; they are trained again after the resume.
      for (const item of held) item.nak();
      if (held.length > 0) log.info({ window: outcome.window, batches: held.length }, `window ${outcome.window}: ${held.length} batch(es) dropped untrained for the pause; back to the queue`);
      held.length = 0;
    }
    await Promise.all(held.map((item, i) => {
      const s = outcome.steps[i]!;
      return ledger.account(item, {
        loss: s.loss, samples: s.samples, computeMs: s.computeMs, stepMs: s.stepMs, staleness: outcome.staleness,
        droppedStale: outcome.droppedStale, partDropped: outcome.partDropped, round: null, window: outcome.window,
      });
    }));
    const soloAlive = ledger.keepAlive(() => solo);
    try {
      for (let i = 0; i < solo.length; i++) {
        try {
          await trainQueued(this.env, solo[i]!, null);
        } catch (e) {
          for (const rest of solo.slice(i + 1)) rest.nak();
          throw e;
        }
      }
    } finally {
      soloAlive.cancel();
    }
    return outcome;
  }

  /**
   * Gives the carried batch (if any) back to the queue: the worker stops,
   * pauses or re-forms its group. Not waited for: with the queue drained
   * (the end of training) the fetch waits up to HPS_TAKE_WAIT_MS for a batch
   * that may never come, and a pause must not wait with it; a batch that does
   * arrive goes straight back.
   */
  private giveBackCarried(): void {
    const c = this.carried;
    this.carried = null;
    this.carriedItem = null;
    if (c === null) return;
    void c.then((item) => {
      try { item?.nak(); } catch (e) {
        // The connection closed meanwhile (the worker stopped): unacknowledged, the batch comes back after ack_wait.
        this.env.log.debug({ err: (e as Error).message }, 'carried batch not given back; it is redelivered after ack_wait');
      }
    }, () => undefined);
  }
}
