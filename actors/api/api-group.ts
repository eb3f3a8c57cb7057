/**
 * An API worker (`HeterogeneousParameterServer`) in a group that reduces
 * together (`sync`, `adaptive`, `accumulation`): the training script's loop
 * drives a `GroupMember` like the worker actor does.
 *
 * The script calls `optimizer.step(batch)` one batch at a time and wants the
 * loss back; the member pulls batches for its windows (`WindowSource.next`).
 * `GroupWindows` joins the two: a step waits in a lane until the member's
 * window takes it, and resolves with its loss as soon as the member stepped
 * it; the window's batches are acknowledged once the group's update of them
 * is out (at the window's end), exactly as a launched worker does. When the
 * data loader finds no batch it tells the lane, so a window does not wait for
 * a batch that will not come; after the script's loop ends, `finish` keeps
 * taking part in (idle) windows until the whole group agrees the job is done.
 *
 * Job-wide pauses (ctl.pause, a checkpoint's cut, a regroup, a recover) are
 * taken like a launched hps worker takes them: the window in progress ends
 * after the step in progress, the group agrees on the window after which it
 * pauses (the highest groups version any member saw), this member reports
 * `ready` and waits for the driver's resume, then forms its group again — a
 * new member under the resumed groups version, in the group the job info now
 * gives it. A step the script handed in meanwhile waits in the lane (its
 * batch kept alive, not acknowledged: no cut counts it) and is trained in
 * the first window after the resume.
 */
import { HetpsError, type Logger } from '../../runtime/mod.ts';
import type { WorkerGroupConfig } from '../../topology/mod.ts';
import type { Batch } from '../../native-bridge/mod.ts';
import type { QueuedBatch } from '../store/batch-queue.ts';
import type { JobInfo } from '../store/job-info.ts';
import type { GroupMember, WindowOutcome, WindowStep } from '../group/group-sync.ts';
import type { LoopControl } from '../worker/loop-control.ts';

interface PendingStep {
  batch: Batch;
  item: QueuedBatch;
  resolve: (step: WindowStep) => void;
  reject: (e: unknown) => void;
}

export interface GroupWindowsOptions {
  /** The group the worker starts in. */
  group: WorkerGroupConfig;
  /** A started member of `group` under the groups version the control trains under now. */
  member: (group: WorkerGroupConfig) => Promise<GroupMember>;
  /** The job-wide pauses this worker follows. */
  control: LoopControl;
  /** This worker's group in a job info it resumed under (a regroup may have moved it). */
  groupIn: (info: JobInfo) => WorkerGroupConfig;
  /** A batch waiting in the lane through a pause is kept alive this often (a third of ack_wait). */
  keepAliveMs: number;
  log: Logger;
  /** True when the job has no batch left anywhere (the queue's pending count is 0). */
  drained: () => Promise<boolean>;
  /** After each window: its batches (in step order), outcome and the group it ran in (a regroup may have moved the worker), to acknowledge and report. */
  onWindow: (held: readonly QueuedBatch[], outcome: WindowOutcome, group: WorkerGroupConfig) => Promise<void>;
  shouldStop: () => boolean;
}

export class GroupWindows {
  private readonly lane: PendingStep[] = [];
  /** Steps the current window took, waiting for its end to be acknowledged. */
  private held: QueuedBatch[] = [];
  private current: PendingStep[] = [];
  private noBatch = false;
  private ended = false;
  private wake: (() => void) | null = null;
  private failure: unknown = null;
  private readonly loop: Promise<void>;
  private group: WorkerGroupConfig;
  private member: GroupMember | null = null;

  constructor(private readonly o: GroupWindowsOptions) {
    this.group = o.group;
    this.loop = this.run().catch((e: unknown) => {
      this.failure = e;
      for (const p of [...this.current, ...this.lane.splice(0)]) p.reject(e);
    });
  }

  /** The script's `optimizer.step`: resolves with the step once the member's window trained it. */
  step(batch: Batch, item: QueuedBatch): Promise<WindowStep> {
    if (this.failure !== null) return Promise.reject(this.failure);
    if (this.ended) return Promise.reject(new HetpsError('step after the data loader ended'));
    return new Promise((resolve, reject) => {
      this.lane.push({ batch, item, resolve, reject });
      this.poke();
    });
  }

  /** The data loader found no batch right now: the window in progress closes with what it has. */
  noBatchNow(): void { this.noBatch = true; this.poke(); }

  /** The script's loop is over: take part in windows until the group agrees it is done. */
  async finish(): Promise<void> {
    this.ended = true;
    this.poke();
    await this.loop;
    if (this.failure !== null) throw this.failure;
  }

  private poke(): void { const w = this.wake; this.wake = null; w?.(); }

  private async next(): Promise<Batch | null> {
    for (;;) {
      const p = this.lane.shift();
      if (p !== undefined) {
        this.current.push(p);
        this.held.push(p.item);
        return p.batch;
      }
      // A pause pending: the window closes with the steps it has (the script may be waiting in saveCheckpoint).
      if (this.ended || this.noBatch || this.o.shouldStop() || this.o.control.jobPausePending) { this.noBatch = false; return null; }
      await Promise.race([new Promise<void>((r) => { this.wake = r; }), this.o.control.nextChange()]);
    }
  }

  private async run(): Promise<void> {
    try {
      for (;;) {
        const member = this.member ??= await this.o.member(this.group);
        this.held = [];
        this.current = [];
        let k = 0;
        const outcome = await member.runWindow({
          next: () => this.next(),
          drained: () => this.o.drained(),
          stepped: (s) => { this.current[k++]?.resolve(s); },
        });
        await this.o.onWindow(this.held, outcome, this.group);
        if (outcome.done || this.o.shouldStop()) return;
        // The group pauses after the window in which any member saw the newer groups version.
        if (outcome.groupsVersion > this.o.control.groupsVersion) await this.pauseForJob(member, outcome.groupsVersion);
      }
    } finally {
      await this.member?.stop();
    }
  }

  private async pauseForJob(member: GroupMember, version: number): Promise<void> {
    const { control, log } = this.o;
    member.regroup(`groups v${version}`);
    this.member = null;
    await member.stop('regrouped');
    log.info({ groups_version: version, group: this.group.name }, `job paused (groups v${version}): paused after window ${member.window - 1} of group ${this.group.name}; waiting for the driver's resume`);
    const keep = setInterval(() => { for (const p of this.lane) p.item.working(); }, Math.max(100, this.o.keepAliveMs));
    let info: JobInfo;
    try {
      info = await control.pauseForJob(version, this.group.name);
    } finally {
      clearInterval(keep);
    }
    this.group = this.o.groupIn(info);
    control.resumedUnder(info, this.group.name);
    log.info({ groups_version: info.resume_version, group: this.group.name, sync_mode: this.group.sync_mode },
      `resumed (groups v${info.resume_version}): ${this.group.sync_mode} in group ${this.group.name} (${this.group.nodes.join(', ')})`);
  }
}
