/**
 * What steers a worker's training loop from outside, and its lifecycle state
 * (`WorkerLoopState`, worker.messages.ts):
 * - stop (mailbox `stop`, or the actor stopping);
 * - this worker's own pause (mailbox `pause` / `resume`);
 * - the job-wide pause, the regroup flow of actors/scheduler/regroup.ts: the
 *   driver writes the job info with a newer groups_version (paused; a regroup
 *   also changes the groups), then resume_version = groups_version (resumed).
 *
 * The mode's loop asks at its step boundaries (`atBoundary` for asp / bsp;
 * hps decides its boundary with its group and calls `pauseForJob` / `hold`).
 * A job-info write, a mailbox message and a stop each wake whoever waits:
 * nothing polls. The job info is watched from `start` to `close`.
 */
import { HetpsError, type Clock, type Logger, type Timer, type Transport } from '../../runtime/mod.ts';
import type { JobInfo, JobInfoStore } from '../store/job-info.ts';
import { publishTelemetry, type RegroupTelemetry } from '../monitor/telemetry.ts';
import { StopRequestedError } from './shard-client.ts';
import { WORKER_END_STATES, type WorkerLoopState } from './worker.messages.ts';

export interface LoopControlOptions {
  node: string;
  runId: string;
  /** The groups version the worker starts under (the job info's groups_version when it started). */
  groupsVersion: number;
  /** null: no job-wide pause reaches this worker. */
  store: JobInfoStore | null;
  /** How long a worker paused by the job waits for the driver's resume before it fails. */
  resumeTimeoutMs: number;
  /** Where the state is shown (the worker's stats). */
  stats: { state: WorkerLoopState };
}

/** What the loop's context provides once it runs. */
export interface LoopControlEnv {
  transport: Transport;
  /** The job name (telemetry subjects). */
  job: string;
  clock: Clock;
  log: Logger;
}

/**
 * The groups version a worker starts training under: the job info's
 * resume_version. While the job is paused or a regroup is in progress
 * (groups_version > resume_version) a worker that starts then is one
 * version behind, so the pause is pending for it too: it pauses at its
 * first boundary instead of training through the others' pause, and an hps
 * member forms under the same membership as the members that started
 * before the pause.
 */
export function startVersion(info: Pick<JobInfo, 'groups_version' | 'resume_version'>): number {
  return Math.min(info.groups_version, info.resume_version);
}

const HELD_STATES: readonly WorkerLoopState[] = ['training', 'pausing', 'paused'];
/** How often the job info is read besides the watch. */
const JOB_INFO_POLL_MS = 3_000;

export class LoopControl {
  private stopAsked = false;
  private pauseAsked = false;
  /** In `hold`: paused by the mailbox alone. */
  private holding = false;
  private version: number;
  private seenValue: number;
  /** The newest job info of this run the watch delivered. */
  private latest: JobInfo | null = null;
  private wakers: (() => void)[] = [];
  private unwatch: (() => void) | null = null;
  private env: LoopControlEnv | null = null;
  /** When the newest groups version was first seen (monotonic ms); null: none since the start. */
  private noticedAt: number | null = null;

  constructor(private readonly o: LoopControlOptions) {
    this.version = o.groupsVersion;
    this.seenValue = o.groupsVersion;
  }

  get state(): WorkerLoopState { return this.o.stats.state; }
  get ended(): boolean { return WORKER_END_STATES.includes(this.state); }
  get stopRequested(): boolean { return this.stopAsked; }
  /** A mailbox pause is asked for and not lifted. */
  get pauseRequested(): boolean { return this.pauseAsked; }
  /** Job-wide pauses reach this worker (it watches the job info). */
  get followsJob(): boolean { return this.o.store !== null; }
  /** The groups version the loop trains under. */
  get groupsVersion(): number { return this.version; }
  /** The newest groups_version seen in the job info (hps members tell their group). */
  get seen(): number { return this.seenValue; }
  /** Milliseconds since this worker learned of the newest groups version (how long its pause took, once paused); null: none seen. */
  get sinceNoticedMs(): number | null { return this.noticedAt === null ? null : Math.round(this.clock.monotonic() - this.noticedAt); }
  /** The driver has paused the job (a newer groups_version) and this worker has not paused for it yet. */
  get jobPausePending(): boolean { return this.followsJob && this.seenValue > this.version; }
  /**
   * The driver takes this worker back into its group (job info `rejoining`:
   * the group dropped it as dead, and it is alive again). Its group no longer
   * waits for it, so the window it is in cannot end: it gives the window up.
   */
  get rejoinPending(): boolean {
    const info = this.latest;
    return this.jobPausePending && info !== null && info.groups_version > this.version && info.rejoining.includes(this.o.node);
  }
  /**
   * The driver gave this worker's place to a standby (it was dead by the
   * health verdicts; job info `standbys` now names it): nobody waits for it
   * any more, so it gives up its window and waits as a standby in turn.
   */
  get replacedPending(): boolean {
    const info = this.latest;
    return this.jobPausePending && info !== null && info.groups_version > this.version && info.standbys.includes(this.o.node) && !info.workers.includes(this.o.node);
  }

  /** A standby again (`replacedPending`): waits, without a limit, until the driver gives it a place; the job info that does. */
  async waitForPlace(): Promise<JobInfo> {
    if (this.o.store === null) throw new HetpsError(`${this.o.node} has no job info to wait on for a place`);
    this.enter('paused');
    for (;;) {
      if (this.stopAsked) throw new StopRequestedError(`${this.o.node} stopped while waiting as a standby`);
      const info = this.latest;
      if (info !== null && info.workers.includes(this.o.node) && info.resume_version >= info.groups_version) return info;
      await this.changed(null);
    }
  }

  /** Watches the job info (if any) and enters `training`; the loop calls `close` when it ends, however it ends. */
  async start(env: LoopControlEnv): Promise<void> {
    this.env = env;
    const store = this.o.store;
    if (store !== null) {
      const stopWatch = await store.watch((info) => this.noteJobInfo(info));
      // Also read it now and then: a watch that stalls across a partition must not leave a worker
      // deaf to a pause, a regroup or its own rejoin (it would hold its batches for ever).
      const poll = env.clock.setInterval(() => { store.get().then((i) => { if (i !== null) this.noteJobInfo(i); }, () => undefined); }, JOB_INFO_POLL_MS);
      this.unwatch = () => { poll.cancel(); stopWatch(); };
    }
    this.enter('training');
  }

  /** Stops watching the job info and wakes any waiter. */
  close(): void {
    const u = this.unwatch;
    this.unwatch = null;
    u?.();
    this.wake();
  }

  /** The loop ended: the final state. */
  end(state: 'done' | 'stopped' | 'failed'): void {
    this.o.stats.state = state;
    this.wake();
  }

  /** Mailbox `stop` (or the actor stopping). True the first time. */
  requestStop(): boolean {
    const first = !this.stopAsked;
    this.stopAsked = true;
    if (HELD_STATES.includes(this.state)) this.o.stats.state = 'stopping';
    this.wake();
    return first;
  }

  /** Mailbox `pause`: taken at the next step boundary. False once the loop has ended. */
  requestPause(): boolean {
    if (this.ended) return false;
    this.pauseAsked = true;
    if (this.state === 'training') this.o.stats.state = 'pausing';
    this.wake();
    return true;
  }

  /** Mailbox `resume`: lifts a mailbox pause (a job-wide pause stays until the driver resumes). False when none was asked for. */
  requestResume(): boolean {
    if (this.ended || !this.pauseAsked) return false;
    this.pauseAsked = false;
    // Shown at once (the reply carries it); the held loop goes on when it wakes.
    if ((this.state === 'pausing' || this.holding) && !this.jobPausePending) this.enter('training');
    this.wake();
    return true;
  }

  /**
   * asp / bsp, between two steps (holding no batch): pauses here while the
   * job or this worker is paused; returns when training may go on, or on stop.
   */
  async atBoundary(group: () => string): Promise<void> {
    for (;;) {
      if (this.stopAsked) return;
      if (this.jobPausePending) {
        const v = this.seenValue;
        this.log.info({ groups_version: v, group: group() }, `job paused (groups v${v}): paused between steps; waiting for the driver's resume`);
        const info = await this.pauseForJob(v, group());
        this.log.info({ groups_version: info.resume_version }, `resumed (groups v${info.resume_version})`);
        this.resumedUnder(info, group());
      } else if (this.pauseAsked) {
        await this.hold();
      } else {
        return;
      }
    }
  }

  /**
   * Paused for the job's groups v`version` at a boundary: reports `ready`
   * (telemetry `regroup`) and waits for the driver's resume; the job info it
   * resumed under. The caller re-forms what it needs, then `resumedUnder`.
   */
  async pauseForJob(version: number, group: string): Promise<JobInfo> {
    this.enter('paused');
    this.publishRegroup({ node: this.o.node, groups_version: version, state: 'ready', group });
    return this.waitForResume(version);
  }

  /** Training goes on under `info`'s resume_version (a later pause pauses the worker again); reports `resumed`. */
  resumedUnder(info: JobInfo, group: string): void {
    this.version = info.resume_version;
    if (this.seenValue < this.version) this.seenValue = this.version;
    this.enter(this.pauseAsked || this.jobPausePending ? 'pausing' : 'training');
    this.publishRegroup({ node: this.o.node, groups_version: this.version, state: 'resumed', group });
  }

  /**
   * At a boundary with a mailbox pause asked for: `paused` until `resume`, a
   * stop, or a job-wide pause (which the caller then honours, still paused).
   */
  async hold(): Promise<void> {
    if (!this.pauseAsked || this.stopAsked) return;
    this.enter('paused');
    this.log.info('paused (mailbox pause): holding no batch until resumed');
    this.holding = true;
    try {
      while (this.pauseAsked && !this.stopAsked && !this.jobPausePending) await this.changed(null);
    } finally {
      this.holding = false;
    }
    if (!this.pauseAsked && !this.stopAsked) {
      this.log.info('resumed (mailbox resume)');
      this.enter(this.jobPausePending ? 'pausing' : 'training');
    }
  }

  /** Waits until the driver resumes `version` (or a later one); fails loudly after the timeout. */
  private async waitForResume(version: number): Promise<JobInfo> {
    const clock = this.clock;
    const limit = this.o.resumeTimeoutMs;
    const started = clock.monotonic();
    let lastNote = started;
    for (;;) {
      if (this.stopAsked) throw new StopRequestedError(`stopped while paused for regroup v${version}`);
      const info = this.latest;
      if (info !== null && info.resume_version >= version) return info;
      const now = clock.monotonic();
      // ctl.pause: an operator's pause lasts as long as they want; only a regroup's resume is overdue.
      const operatorPause = info !== null && info.paused && info.groups_version === version;
      if (!operatorPause && now - started >= limit) throw new HetpsError(`regroup v${version}: the driver did not resume training within ${Math.round(limit / 1000)} s`);
      const noteEvery = operatorPause ? 60_000 : 10_000;
      if (now - lastNote >= noteEvery) {
        lastNote = now;
        if (operatorPause) this.log.info({ groups_version: version, waited_s: Math.round((now - started) / 1000) }, 'paused by ctl.pause: waiting for ctl.resume');
        else this.log.warn({ groups_version: version, waited_s: Math.round((now - started) / 1000) }, `paused for regroup v${version}: still waiting for the driver's resume`);
      }
      await this.changed(Math.max(1, Math.min(operatorPause ? noteEvery : limit - (now - started), noteEvery - (now - lastNote))));
    }
  }

  private noteJobInfo(info: JobInfo): void {
    if (info.run_id !== this.o.runId) return;
    // A read that was overtaken by a newer write (the poll beside the watch) changes nothing.
    const l = this.latest;
    if (l !== null && (info.groups_version < l.groups_version || (info.groups_version === l.groups_version && info.resume_version < l.resume_version))) return;
    this.latest = info;
    if (info.groups_version > this.seenValue) {
      this.seenValue = info.groups_version;
      this.noticedAt = this.clock.monotonic();
    }
    if (this.jobPausePending && this.state === 'training') this.o.stats.state = 'pausing';
    this.wake();
  }

  /** A stop asked for wins over the held states. */
  private enter(state: WorkerLoopState): void {
    if (this.ended) return;
    this.o.stats.state = this.stopAsked && HELD_STATES.includes(state) ? 'stopping' : state;
  }

  private publishRegroup(t: RegroupTelemetry): void {
    const env = this.started;
    publishTelemetry(env.transport, env.job, 'regroup', this.o.node, t);
  }

  /** Resolves when anything this control watches changes (a job-info write, a mailbox message, a stop), or after `ms` (null: no limit). */
  nextChange(ms: number | null = null): Promise<void> { return this.changed(ms); }

  /** Resolves on the next wake, or after `ms` (null: no limit). */
  private changed(ms: number | null): Promise<void> {
    return new Promise((resolve) => {
      let timer: Timer | null = null;
      const done = () => { timer?.cancel(); resolve(); };
      if (ms !== null) timer = this.clock.setTimeout(() => { this.wakers = this.wakers.filter((f) => f !== done); resolve(); }, Math.max(0, ms));
      this.wakers.push(done);
    });
  }

  private wake(): void {
    const w = this.wakers;
    this.wakers = [];
    for (const f of w) f();
  }

  private get started(): LoopControlEnv {
    if (this.env === null) throw new HetpsError('worker loop control used before start');
    return this.env;
  }
  private get clock(): Clock { return this.started.clock; }
  private get log(): Logger { return this.started.log; }
}
