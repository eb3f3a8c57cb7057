/**
 * Regrouping during training (hps), served by the process that runs the
 * driver (`hetps up`).
 *
 * The command: `hps.<job>.ctl.regroup`, request/reply, msgpack or JSON (by
 * the `Content-Type: application/json` header), body
 * `{ groups: [{ name, nodes, sync_mode, sync_steps, … }] | null, reason }`;
 * `groups: null` recomputes the grouping from the workers' latest profiles
 * scaled by their observed slowdown, or from their step times alone when a
 * worker has published no profile (see `speedGroups`). Reply (the actors' reply envelope):
 * `{ accepted, groups_version, groups }`, or an error (unknown node, a worker
 * missing from the new groups, a node in two groups, a regroup already in
 * progress, not an hps job).
 *
 * The flow:
 * 1. the driver writes the new groups with groups_version + 1 into the job
 *    info store (resume_version stays behind: a regroup is in progress);
 * 2. every worker polls the job info; at its next window boundary (the
 *    window pushed and its batches acknowledged as usual) it stops stepping.
 *    A sync / adaptive group agrees on that boundary through its slices
 *    (each carries the newest version its sender has seen; every member
 *    takes the largest), so no member waits for a peer that paused;
 * 3. each worker reports `ready` (telemetry `regroup`); the driver waits for
 *    every live worker (started, loop not ended), at most `readyTimeoutMs`
 *    (then it says who is missing and resumes anyway: a late worker pauses
 *    and resumes at once);
 * 4. the driver writes resume_version = groups_version; the workers re-form
 *    their group member with the new membership and sync settings and go on.
 *    A new window starts by pulling the dense parameters and each batch's
 *    rows from the shards, so every group continues from the shards' one
 *    current parameter version; nothing is stepped in between.
 *
 * Automatic trigger: every `autoEveryMs` the driver feeds the workers' step
 * times (batch telemetry) to `detectDegradation` (topology/regroup.ts, with
 * its calm defaults: median of 20 steps, 50% slower for 30 s, 120 s
 * cooldown) and, when it says so, runs the same flow with recomputed groups.
 */
import { z } from 'zod';
import {
  ConfigError, HetpsError, ValidationError, Wakeup,
  type Clock, type Logger, type Timer, type Transport,
} from '../../runtime/mod.ts';
import {
  INITIAL_DEGRADATION_STATE, baselineStepMs, detectDegradation, groupNodes, medianOf, needsRejoin, noteRegrouped, observedSlowdown, standbyReplacement, strandedGroups,
  profilesAtObservedSpeed, regroupPlan, workerGroupSchema,
  type DegradationPolicy, type DegradationState, type NodeProfile, type WorkerGroupConfig,
} from '../../topology/mod.ts';
import type { JobInfo, JobInfoStore } from '../store/job-info.ts';
import type { ProfileStore } from '../store/profile-store.ts';
import { nodeProfileOf, subscribeTelemetry } from '../monitor/telemetry.ts';
import type { HealthState, HealthView } from '../health/health.types.ts';

export const REGROUP_COMMAND = 'regroup';

const groupSchema = workerGroupSchema;

export const regroupRequestSchema = z.object({
  groups: z.array(groupSchema).min(1).nullable().default(null),
  reason: z.string().min(1).default('control command'),
});
export type RegroupRequest = z.input<typeof regroupRequestSchema>;

export interface RegroupReply {
  accepted: boolean;
  groups_version: number;
  groups: WorkerGroupConfig[];
  /** Why not accepted (the grouping would not change). */
  note?: string;
}

export interface RegroupRecord {
  /** Seconds since the controller started (the job was created). */
  at_s: number;
  reason: string;
  /**
   * `rejoin`: the groups unchanged, re-formed to take back workers alive again after their group dropped them;
   * `standby`: a standby worker took a dead member's place.
   */
  trigger: 'command' | 'automatic' | 'rejoin' | 'standby' | 'recovery-timeout' | 'recover' | 'stranded';
  groups_version: number;
  groups: WorkerGroupConfig[];
  /** Nodes whose group changed. */
  moved: string[];
  /** `command`: the groups were given; `profiles`: recomputed from profiles scaled by observed slowdown; `step_times`: from step times alone; `unchanged`: a rejoin. */
  grouped_by: 'command' | 'profiles' | 'step_times' | 'unchanged';
  /** Workers taken back into their group (trigger `rejoin`); empty otherwise. */
  rejoined: string[];
  /** Standbys that took a dead member's place (trigger `standby`); empty otherwise. */
  replaced: { dead: string; standby: string; group: string }[];
  /** Seconds from the new groups being written to the resume. */
  pause_s: number;
  /** Live workers that had not reported ready when the driver resumed (after readyTimeoutMs); empty normally. */
  not_ready: string[];
}

export interface RegroupControllerOptions {
  transport: Transport;
  job: string;
  jobStore: JobInfoStore;
  /** The job info as prepared (groups_version 0). */
  info: JobInfo;
  clock: Clock;
  log: Logger;
  policy?: Partial<DegradationPolicy>;
  /** How long the driver waits for every live worker to pause. Default 60 s. */
  readyTimeoutMs?: number;
  /** Degradation checks; 0: no automatic regroup. Default 1 s. */
  autoEveryMs?: number;
  /** The workers' latest profiles, read again before each recomputed grouping; null or absent: profile telemetry only. */
  profileStore?: ProfileStore | null;
  /** Profiles known when the job started (those its groups were measured from). */
  profiles?: readonly NodeProfile[];
  /** The health verdicts: a dead worker is not waited for (a pause or regroup would wait for its report forever). Absent: none. */
  isDead?: (node: string) => boolean;
  /**
   * The health verdicts, followed for rejoins: a worker of a reducing hps
   * group that was dead and is alive again (a healed link, a continued
   * process) was dropped by its group, which no longer waits for it; the
   * controller re-forms the groups unchanged with the worker named in the job
   * info's `rejoining`. Absent: no rejoins (the worker stays out of its group's rounds).
   */
  health?: HealthView | null;
  /**
   * With `health`: a reducing group whose members report it `degraded` for
   * this long while the verdicts call every member alive is re-formed
   * unchanged (trigger `stranded`): the dead verdict that degraded it came and
   * went without this controller seeing it (it took over after it, as a
   * standby driver does), so no rejoin would come. Default: the job's
   * worker recovery timeout (how long a group waits for a member); 0: never.
   */
  strandedAfterMs?: number;
  /** Every live worker has paused for `groupsVersion` (ctl.pause). */
  onPaused?: (groupsVersion: number, workers: string[]) => void;
}

/** Recent step times kept per node (the median reads the last `window`). */
const KEEP_STEPS = 200;

export class RegroupController {
  readonly records: RegroupRecord[] = [];
  private info: JobInfo;
  private inProgress: Promise<void> | null = null;
  private readonly ready = new Map<number, Set<string>>();
  private readonly started = new Set<string>();
  private readonly ended = new Set<string>();
  private readonly steps = new Map<string, number[]>();
  private readonly baselines = new Map<string, number>();
  /** Latest profile per worker (the start's, then profile telemetry and the store). */
  private readonly profiles = new Map<string, NodeProfile>();
  /** Slowdown observed before the current baselines were taken (a regroup resets them). */
  private readonly carriedSlowdown = new Map<string, number>();
  private degradation: DegradationState = INITIAL_DEGRADATION_STATE;
  private readonly t0: number;
  private readonly unsubscribe: () => void;
  private readonly timer: Timer | null;
  private checking = false;
  private disposed = false;
  private readonly wakeup = new Wakeup();
  /** Monotonic ms of the pause in force; null when not paused. */
  private pausedAt: number | null = null;
  private pauseDone = false;
  /** A pause taken by `pauseUntilPaused` (a checkpoint's cut), until its caller resumes: ctl.pause, regroup and recover wait for it instead of finding the job paused. */
  private cut: { done: Promise<void>; lift: () => void } | null = null;
  private readonly window: number;
  /** Workers seen dead by the health verdicts and not alive since. */
  private readonly deadSeen = new Set<string>();
  /** Workers alive again whose group must take them back (a rejoin not yet started). */
  private readonly returning = new Set<string>();
  /** Dead workers a standby should replace (not yet done). */
  private readonly toReplace = new Set<string>();
  /** Dead members of reducing groups whose group runs async without them, with the timer of their recovery timeout. */
  private readonly cutTimers = new Map<string, Timer>();
  /** Dead past the recovery timeout: their groups re-form without them (not yet done). */
  private readonly toReform = new Set<string>();
  /** Per worker: since when (monotonic ms) its progress reports say its group is degraded; cleared by every regroup. */
  private readonly degradedSince = new Map<string, number>();
  /** Groups left degraded with every member alive (strandedGroups): re-formed unchanged (not yet done). */
  private readonly stranded = new Set<string>();
  /** Stranded re-forms per group so far: each one doubles the wait before the next (at most 8×), should the group keep degrading. */
  private readonly strandedTimes = new Map<string, number>();
  private readonly strandTimer: Timer | null;
  private rejoinLoop: Promise<void> | null = null;
  private readonly unwatchHealth: (() => void) | null;

  constructor(private readonly o: RegroupControllerOptions) {
    this.info = o.info;
    this.t0 = o.clock.monotonic();
    this.window = o.policy?.window ?? 20;
    for (const p of o.profiles ?? []) this.profiles.set(p.node, p);
    this.unsubscribe = subscribeTelemetry(o.transport, o.job, {
      profile: (t) => { this.profiles.set(t.node, nodeProfileOf(t)); },
      start: (t) => { this.started.add(t.node); },
      done: (t) => { this.ended.add(t.node); this.degradedSince.delete(t.node); this.wake(); },
      progress: (t) => {
        if (t.group_state !== 'degraded') this.degradedSince.delete(t.node);
        else if (!this.degradedSince.has(t.node)) this.degradedSince.set(t.node, this.o.clock.monotonic());
      },
      batch: (t) => {
        this.started.add(t.node);
        const ms = t.emulated_step_ms ?? t.busy_ms;
        if (ms === null) return;
        let a = this.steps.get(t.node);
        if (a === undefined) { a = []; this.steps.set(t.node, a); }
        a.push(ms);
        if (a.length > KEEP_STEPS) a.splice(0, a.length - KEEP_STEPS);
        if (!this.baselines.has(t.node)) {
          const b = baselineStepMs(a, this.window);
          if (b !== null) this.baselines.set(t.node, b);
        }
      },
      regroup: (t) => {
        this.started.add(t.node);
        if (t.state !== 'ready') return;
        let s = this.ready.get(t.groups_version);
        if (s === undefined) { s = new Set(); this.ready.set(t.groups_version, s); }
        s.add(t.node);
        this.wake();
      },
    });
    this.unwatchHealth = o.health?.onChange((node, state) => this.noteVerdict(node, state)) ?? null;
    const every = o.autoEveryMs ?? 1_000;
    this.timer = every > 0 && o.info.mode === 'hps' ? o.clock.setInterval(() => { void this.autoCheck(); }, every) : null;
    const strandedAfter = this.strandedAfterMs;
    this.strandTimer = o.health && strandedAfter > 0 && o.info.mode === 'hps'
      ? o.clock.setInterval(() => this.checkStranded(), Math.max(100, Math.min(2_000, strandedAfter / 4))) : null;
  }

  /** The job info as last written (the one writer is this controller). */
  get jobInfo(): JobInfo { return this.info; }

  /** The groups the job runs now. */
  get groups(): WorkerGroupConfig[] { return this.info.groups ?? []; }

  /** Waits for a regroup in progress (at the end of training), then stops listening. */
  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    this.cut?.lift();
    this.cut = null;
    this.timer?.cancel();
    this.strandTimer?.cancel();
    for (const t of this.cutTimers.values()) t.cancel();
    this.cutTimers.clear();
    this.unwatchHealth?.();
    this.wake();
    await this.rejoinLoop?.catch(() => undefined);
    await this.inProgress?.catch(() => undefined);
    this.unsubscribe();
  }

  /** Live workers: their loop started and has not ended, and the health actor does not say they are dead. */
  private live(): string[] {
    return this.info.workers.filter((w) => this.started.has(w) && !this.ended.has(w) && !(this.o.isDead?.(w) ?? false));
  }

  /** Starts a regroup (see the module comment); resolves once the new groups are written, not when training resumes. */
  async regroup(groups: z.input<typeof groupSchema>[] | null, reason: string, trigger: RegroupRecord['trigger'] = 'command'): Promise<RegroupReply> {
    const { log } = this.o;
    if (this.info.mode !== 'hps') throw new ConfigError(`regroup: the job runs training.mode ${this.info.mode}; only hps has worker groups`);
    await this.afterCut();
    if (this.inProgress !== null) {
      throw new HetpsError(`regroup: groups v${this.info.groups_version} are being put in place (workers pausing); try again once training has resumed`);
    }
    if (this.pausedAt !== null) throw new HetpsError('regroup: the job is paused; send resume first (a regroup pauses and resumes by itself)');
    const current = this.groups;
    if (groups === null) await this.refreshProfiles();
    const computed = groups === null ? this.computeGroups() : null;
    const next = computed?.groups ?? groups!.map((g) => groupSchema.parse(g));
    const groupedBy: RegroupRecord['grouped_by'] = computed?.basis ?? 'command';
    this.validate(next);
    const plan = regroupPlan(current.map((g) => ({ name: g.name, nodes: g.nodes, centroid: null })), next.map((g) => ({ name: g.name, nodes: g.nodes, centroid: null })));
    if (!plan.changed && normalized(current) === normalized(next)) {
      return { accepted: false, groups_version: this.info.groups_version, groups: current, note: 'the new grouping is the same as the current one' };
    }
    const moved = plan.moves.map((m) => m.node);
    const v = await this.writeGroups(next, []);
    log.info({ groups_version: v, reason, trigger, moves: plan.moves, groups: next },
      `regroup to groups v${v} (${reason}): ${plan.moves.map((m) => `${m.node} ${m.from ?? '-'} → ${m.to ?? '-'}`).join(', ') || 'group settings change'}; `
      + 'workers pause at their next window boundary');
    this.startCompletion({ v, reason, trigger, groups: next, moved, groupedBy, rejoined: [], replaced: [] });
    return { accepted: true, groups_version: v, groups: next };
  }

  /**
   * `ctl.recover` (`hetps recover --force-sync`): every group re-forms with
   * the groups unchanged — each member gives up nothing, pauses at its
   * window boundary, pulls fresh parameters and syncs again (a group
   * degraded to async included; a member dead by the verdicts is left out).
   */
  async recover(reason: string): Promise<RegroupReply> {
    if (this.info.mode !== 'hps') throw new HetpsError(`recover: training.mode ${this.info.mode} has no groups to re-form (hps only)`);
    await this.afterCut();
    if (this.pausedAt !== null) throw new HetpsError('recover: the job is paused; resume it first (the groups re-form on the resume anyway)');
    while (this.inProgress !== null) await this.inProgress.catch(() => undefined);
    const v = await this.reform(reason, 'recover', []);
    this.o.log.info({ groups_version: v, reason }, `recover (groups v${v}, ${reason}): every group re-forms unchanged at its next window boundary: a fresh pull, then synchronous rounds`);
    return { accepted: true, groups_version: v, groups: this.groups };
  }

  /** The groups written again unchanged as the next groups_version (every group re-forms), naming the workers taken back; completed in the background. */
  private async reform(reason: string, trigger: RegroupRecord['trigger'], rejoining: string[]): Promise<number> {
    const v = await this.writeGroups(this.groups, rejoining);
    this.startCompletion({ v, reason, trigger, groups: this.groups, moved: [], groupedBy: 'unchanged', rejoined: rejoining, replaced: [] });
    return v;
  }

  /** Writes `groups` as the next groups_version (the workers pause for it), naming the workers taken back. */
  private async writeGroups(groups: WorkerGroupConfig[], rejoining: string[], members?: { workers: string[]; standbys: string[] }): Promise<number> {
    const v = this.info.groups_version + 1;
    this.info = { ...this.info, groups, groups_version: v, rejoining, ...(members ?? {}) };
    await this.o.jobStore.put(this.info);
    return v;
  }

  private startCompletion(r: {
    v: number; reason: string; trigger: RegroupRecord['trigger']; groups: WorkerGroupConfig[]; moved: string[]; groupedBy: RegroupRecord['grouped_by'];
    rejoined: string[]; replaced: RegroupRecord['replaced'];
  }): void {
    const started = this.o.clock.monotonic();
    this.inProgress = this.complete(r.v, r.reason, r.trigger, r.groups, r.moved, r.groupedBy, { rejoined: r.rejoined, replaced: r.replaced }, started)
      // Reports from before the re-form may still arrive: a group counts as degraded again only from reports after it.
      .finally(() => { this.inProgress = null; this.degradedSince.clear(); });
  }

  /**
   * A health verdict: a worker of a reducing group that was dead and is
   * alive again is taken back into its group (see `health` in the options).
   */
  private noteVerdict(node: string, state: HealthState): void {
    if (this.disposed || !(this.info.workers.includes(node) || this.info.standbys.includes(node))) return;
    if (state === 'dead') {
      this.deadSeen.add(node);
      this.returning.delete(node);
      if (this.info.mode !== 'hps' || !this.info.workers.includes(node)) return;
      // Its group runs async without it; past the recovery timeout the group re-forms without it, in sync again.
      if (needsRejoin(this.groups, node) && !this.cutTimers.has(node)) {
        const ms = this.info.recovery_timeout_ms ?? this.info.ack_wait_ms;
        this.cutTimers.set(node, this.o.clock.setTimeout(() => {
          this.cutTimers.delete(node);
          if (this.disposed || !this.deadSeen.has(node)) return;
          this.toReform.add(node);
          this.rejoinLoop ??= this.rejoin().finally(() => { this.rejoinLoop = null; });
        }, ms));
      }
      if (this.info.standbys.length === 0) return;
      this.toReplace.add(node);
    } else {
      if (state !== 'alive' || !this.deadSeen.delete(node)) return;
      this.toReplace.delete(node);
      this.toReform.delete(node);
      this.cutTimers.get(node)?.cancel();
      this.cutTimers.delete(node);
      if (this.info.mode !== 'hps' || !needsRejoin(this.groups, node)) return;
      this.returning.add(node);
    }
    this.rejoinLoop ??= this.rejoin().finally(() => { this.rejoinLoop = null; });
  }

  /** Re-forms the groups unchanged for the workers in `returning`, once no regroup or pause is in the way. */
  private async rejoin(): Promise<void> {
    const { log } = this.o;
    while ((this.returning.size > 0 || this.toReplace.size > 0 || this.toReform.size > 0 || this.stranded.size > 0) && !this.disposed) {
      if (this.inProgress !== null) { await this.inProgress.catch(() => undefined); continue; }
      // An operator's pause: the rejoin follows the resume.
      if (this.pausedAt !== null) { await this.changed(1_000); continue; }
      if (this.toReplace.size > 0) { await this.replaceDead(); continue; }
      if (this.toReform.size > 0) { await this.reformWithoutDead(); continue; }
      if (this.stranded.size > 0) { await this.reformStranded(); continue; }
      const nodes = [...this.returning].sort();
      this.returning.clear();
      // Still alive (a verdict may have come and gone meanwhile), and still in a group that reduces.
      const back = nodes.filter((n) => !(this.o.isDead?.(n) ?? false) && needsRejoin(this.groups, n));
      if (back.length === 0) continue;
      const reason = `${back.join(', ')} alive again after ${back.length > 1 ? 'their groups' : 'its group'} dropped ${back.length > 1 ? 'them' : 'it'}`;
      try {
        const v = await this.reform(reason, 'rejoin', back);
        log.info({ groups_version: v, rejoining: back }, `rejoin (groups v${v}): ${reason}; the groups re-form unchanged at the next window boundary (a fresh pull, then synchronous rounds again)`);
      } catch (e) {
        log.warn({ err: (e as Error).message, rejoining: back }, `rejoin of ${back.join(', ')} failed: could not write the job info; they stay out of their group's rounds`);
      }
    }
  }

  private get strandedAfterMs(): number { return this.o.strandedAfterMs ?? this.info.recovery_timeout_ms ?? this.info.ack_wait_ms; }

  /** Reducing groups degraded with every member alive (see `strandedAfterMs`) are queued for a re-form. */
  private checkStranded(): void {
    if (this.disposed || this.inProgress !== null || this.pausedAt !== null || this.cut !== null || this.rejoinLoop !== null) return;
    const found = this.strandedNow();
    if (found.length === 0) return;
    for (const g of found) this.stranded.add(g);
    this.rejoinLoop ??= this.rejoin().finally(() => { this.rejoinLoop = null; });
  }

  private strandedNow(): string[] {
    return strandedGroups(this.groups, (n) => this.degradedSince.get(n) ?? null, (n) => this.o.health?.stateOf(n) === 'alive', this.o.clock.monotonic(),
      (g) => this.strandedAfterMs * 2 ** Math.min(3, this.strandedTimes.get(g) ?? 0));
  }

  /** Re-forms the groups unchanged for the groups in `stranded`, still degraded with every member alive. */
  private async reformStranded(): Promise<void> {
    const { log } = this.o;
    const still = this.strandedNow().filter((g) => this.stranded.has(g));
    for (const g of still) this.strandedTimes.set(g, (this.strandedTimes.get(g) ?? 0) + 1);
    this.stranded.clear();
    if (still.length === 0) return;
    const now = this.o.clock.monotonic();
    const longest = Math.max(...this.groups.filter((g) => still.includes(g.name)).flatMap((g) => g.nodes.map((n) => now - (this.degradedSince.get(n) ?? now))));
    const reason = `${still.length > 1 ? 'groups' : 'group'} ${still.join(', ')} degraded for ${(longest / 1000).toFixed(1)} s with every member alive by the health verdicts (a dead verdict that came and went before this driver could follow it)`;
    try {
      const v = await this.reform(reason, 'stranded', []);
      log.warn({ groups_version: v, groups: still }, `regroup to groups v${v} (${reason}): the groups re-form unchanged at the next window boundary and sync again`);
    } catch (e) {
      log.warn({ err: (e as Error).message, groups: still }, `re-forming ${still.join(', ')} failed: could not write the job info; ${still.length > 1 ? 'they stay' : 'it stays'} async`);
    }
  }

  /**
   * The workers in `toReform` stayed dead past the recovery timeout: their
   * groups, async meanwhile, re-form unchanged; each member forms without the
   * dead (by the verdicts) and syncs again. Should one come back, it is taken
   * back like any dead member alive again (a rejoin).
   */
  private async reformWithoutDead(): Promise<void> {
    const { log } = this.o;
    const dead = [...this.toReform].sort().filter((n) => (this.o.isDead?.(n) ?? true) && needsRejoin(this.groups, n));
    this.toReform.clear();
    if (dead.length === 0) return;
    const s = ((this.info.recovery_timeout_ms ?? this.info.ack_wait_ms) / 1000).toFixed(1);
    const reason = `${dead.join(', ')} dead for longer than the worker recovery timeout (${s} s)`;
    try {
      const v = await this.reform(reason, 'recovery-timeout', []);
      log.warn({ groups_version: v, dead }, `regroup to groups v${v} (${reason}): ${dead.length > 1 ? 'their groups re-form' : 'its group re-forms'} without ${dead.length > 1 ? 'them' : 'it'} and syncs again; should ${dead.length > 1 ? 'they' : 'it'} come back, ${dead.length > 1 ? 'they are' : 'it is'} taken back`);
    } catch (e) {
      log.warn({ err: (e as Error).message, dead }, `re-forming the groups of ${dead.join(', ')} failed: could not write the job info; they stay async`);
    }
  }

  /** Standbys take the places of the dead workers in `toReplace` (still dead), one regroup for all of them. */
  private async replaceDead(): Promise<void> {
    const { log } = this.o;
    const dead = [...this.toReplace].sort();
    this.toReplace.clear();
    let m = { groups: this.groups, workers: this.info.workers, standbys: this.info.standbys };
    const replaced: RegroupRecord['replaced'] = [];
    const isAlive = (n: string) => this.o.health?.stateOf(n) === 'alive';
    for (const d of dead) {
      if (!(this.o.isDead?.(d) ?? true)) continue; // alive again meanwhile: a rejoin, not a replacement
      const r = standbyReplacement(m, d, isAlive);
      if (r === null) {
        log.warn({ dead: d, standbys: m.standbys }, `${d} is dead and no standby worker is alive to take its place (${m.standbys.join(', ') || 'none left'}); its group goes on without it`);
        continue;
      }
      m = r.membership;
      replaced.push({ dead: d, standby: r.standby, group: r.group });
    }
    if (replaced.length === 0) return;
    const reason = replaced.map((x) => `standby ${x.standby} takes dead ${x.dead}'s place in group ${x.group}`).join('; ');
    const moved = replaced.flatMap((x) => [x.dead, x.standby]);
    try {
      const v = await this.writeGroups(m.groups, [], { workers: m.workers, standbys: m.standbys });
      log.info({ groups_version: v, replaced }, `regroup to groups v${v} (${reason}): the other members pause at their next window boundary, then every group re-forms`);
      this.startCompletion({ v, reason, trigger: 'standby', groups: m.groups, moved, groupedBy: 'unchanged', rejoined: [], replaced });
    } catch (e) {
      log.warn({ err: (e as Error).message, replaced }, 'standby replacement failed: could not write the job info; the groups go on without the dead members');
    }
  }

  private async complete(
    v: number, reason: string, trigger: RegroupRecord['trigger'], groups: WorkerGroupConfig[], moved: string[], groupedBy: RegroupRecord['grouped_by'],
    members: Pick<RegroupRecord, 'rejoined' | 'replaced'>, started: number,
  ): Promise<void> {
    const { clock, log } = this.o;
    const limit = this.o.readyTimeoutMs ?? 60_000;
    let lastNote = started;
    let missing: string[] = [];
    for (;;) {
      const ready = this.ready.get(v) ?? new Set<string>();
      // A standby given a place starts under this version: it has nothing to pause.
      missing = this.live().filter((w) => !ready.has(w) && !members.replaced.some((r) => r.standby === w));
      if (missing.length === 0) break;
      const now = clock.monotonic();
      if (now - started >= limit) {
        log.warn({ groups_version: v, not_ready: missing },
          `regroup v${v}: ${missing.join(', ')} did not pause within ${Math.round(limit / 1000)} s; resuming the others (a late worker resumes as soon as it pauses)`);
        break;
      }
      if (now - lastNote >= 10_000) {
        lastNote = now;
        log.info({ groups_version: v, waiting_for: missing }, `regroup v${v}: waiting for ${missing.join(', ')} to finish their window and pause`);
      }
      await this.changed(Math.min(10_000, limit - (now - started)));
    }
    this.info = { ...this.info, resume_version: v };
    await this.o.jobStore.put(this.info);
    const now = clock.monotonic();
    // The slow speed is now the node's normal: new baselines, and the cooldown starts. The profiles
    // still describe the nodes as they joined, so the slowdown so far is carried over.
    for (const w of this.info.workers) this.carriedSlowdown.set(w, this.slowdownOf(w));
    this.steps.clear();
    this.baselines.clear();
    this.degradation = noteRegrouped(this.degradation, now);
    const pause = (now - started) / 1000;
    this.records.push({
      at_s: +((started - this.t0) / 1000).toFixed(3), reason, trigger, groups_version: v, groups, moved, grouped_by: groupedBy, ...members, pause_s: +pause.toFixed(3), not_ready: missing,
    });
    log.info({ groups_version: v, pause_s: pause }, `regroup v${v} done: every group resumes from the shards' current parameters (paused ${pause.toFixed(1)} s)`);
  }

  /** Something the flows wait on happened (a worker paused or ended, or the controller is disposed). */
  private wake(): void { this.wakeup.wake(); }

  /** Resolves on the next `wake`, or after `ms`. */
  private changed(ms: number): Promise<void> { return this.wakeup.changed(this.o.clock, Math.max(1, ms)); }

  /**
   * Where the job stands: `training`; `regrouping` (workers pausing for new
   * groups); `pausing` (ctl.pause sent, workers finishing their window or
   * step); `paused` (every live worker paused).
   */
  get state(): 'training' | 'regrouping' | 'pausing' | 'paused' {
    if (this.pausedAt !== null) return this.pauseDone ? 'paused' : 'pausing';
    return this.inProgress !== null ? 'regrouping' : 'training';
  }

  /** Live workers that have paused for the current version (pause or regroup). */
  pausedWorkers(): string[] {
    const ready = this.ready.get(this.info.groups_version) ?? new Set<string>();
    return this.info.workers.filter((w) => ready.has(w));
  }

  /**
   * `ctl.pause`: every worker stops at its next window (hps) or step (asp,
   * bsp) boundary, its last batches pushed and acknowledged, and waits for
   * `resume`. The same flow as a regroup with the groups unchanged:
   * groups_version + 1, no resume_version until `resume`. Resolves once the
   * new version is written; `paused` follows when every live worker reports.
   */
  async pause(reason: string): Promise<{ state: string; groups_version: number; already: boolean }> {
    await this.afterCut();
    if (this.pausedAt !== null) return { state: this.state, groups_version: this.info.groups_version, already: true };
    if (this.inProgress !== null) throw new HetpsError(`pause: groups v${this.info.groups_version} are being put in place; try again once the regroup is done`);
    const v = this.info.groups_version + 1;
    this.info = { ...this.info, groups_version: v, paused: true, rejoining: [] };
    await this.o.jobStore.put(this.info);
    this.pausedAt = this.o.clock.monotonic();
    this.pauseDone = false;
    this.o.log.info({ groups_version: v, reason }, `pause (${reason}): every worker stops at its next window or step boundary`);
    void this.awaitPaused(v);
    return { state: this.state, groups_version: v, already: false };
  }

  /**
   * Pauses the job and resolves once every live worker has paused (a
   * regroup in progress is let finish first). `already`: a pause was in
   * force before (the caller must not resume it). A pause taken here is the
   * caller's to lift with `resume`, soon (a checkpoint's cut): meanwhile
   * ctl.pause, regroup and recover wait for it rather than find the job paused. `timeoutMs` bounds the
   * whole wait, the regroup's included: past it, throws naming the regroup still in place or the
   * workers that did not pause, with its pause undone.
   */
  async pauseUntilPaused(reason: string, timeoutMs: number): Promise<{ already: boolean; groups_version: number }> {
    const started = this.o.clock.monotonic();
    while (this.inProgress !== null) {
      const waited = this.o.clock.monotonic() - started;
      if (waited >= timeoutMs) {
        const v = this.info.groups_version;
        const missing = this.notPaused();
        throw new HetpsError(`${reason}: groups v${v} were still being put in place after ${Math.round(timeoutMs / 1000)} s`
          + `${missing.length > 0 ? ` (${missing.join(', ')} not paused for them yet)` : ''}; nothing was paused for it, training goes on (try again once the regroup is done, or look at those workers)`);
      }
      await Promise.race([this.inProgress.catch(() => undefined), this.changed(Math.min(250, timeoutMs - waited))]);
    }
    const r = await this.pause(reason);
    if (!r.already) {
      let lift = () => {};
      const done = new Promise<void>((res) => { lift = res; });
      this.cut = { done, lift };
    }
    for (;;) {
      if (this.pauseDone) return { already: r.already, groups_version: r.groups_version };
      if (this.pausedAt === null) throw new HetpsError(`${reason}: the pause was lifted (ctl.resume) before every worker paused`);
      const waited = this.o.clock.monotonic() - started;
      if (waited >= timeoutMs) {
        const missing = this.notPaused();
        if (!r.already) await this.resume().catch(() => undefined);
        throw new HetpsError(`${reason}: ${missing.join(', ')} did not pause within ${Math.round(timeoutMs / 1000)} s; training goes on (try again, or look at those workers)`);
      }
      await this.changed(Math.min(250, timeoutMs - waited));
    }
  }

  /** Live workers not paused yet for the current groups version. */
  private notPaused(): string[] {
    const ready = this.ready.get(this.info.groups_version) ?? new Set<string>();
    return this.live().filter((w) => !ready.has(w));
  }

  /** Until the pause of a checkpoint's cut (if one is in force) is lifted. */
  private async afterCut(): Promise<void> {
    while (this.cut !== null) await this.cut.done;
  }

  /** `ctl.resume`: the paused workers continue (each hps group pulls fresh parameters first). */
  async resume(): Promise<{ state: string; groups_version: number; paused_s: number }> {
    if (this.pausedAt === null) throw new HetpsError(`resume: the job is not paused (it is ${this.state})`);
    const v = this.info.groups_version;
    this.info = { ...this.info, resume_version: v, paused: false };
    await this.o.jobStore.put(this.info);
    const pausedS = (this.o.clock.monotonic() - this.pausedAt) / 1000;
    this.pausedAt = null;
    this.pauseDone = false;
    const cut = this.cut;
    this.cut = null;
    cut?.lift();
    this.o.log.info({ groups_version: v, paused_s: pausedS }, `resumed after ${pausedS.toFixed(1)} s`);
    this.wake();
    return { state: this.state, groups_version: v, paused_s: +pausedS.toFixed(3) };
  }

  private async awaitPaused(v: number): Promise<void> {
    for (;;) {
      if (this.pausedAt === null || this.disposed || this.info.groups_version !== v) return;
      const ready = this.ready.get(v) ?? new Set<string>();
      const missing = this.live().filter((w) => !ready.has(w));
      if (missing.length === 0) {
        this.pauseDone = true;
        this.o.onPaused?.(v, [...ready]);
        this.wake();
        return;
      }
      await this.changed(1_000);
    }
  }

  private validate(groups: WorkerGroupConfig[]): void {
    const workers = new Set(this.info.workers);
    const seen = new Map<string, string>();
    const names = new Set<string>();
    for (const g of groups) {
      if (names.has(g.name)) throw new ValidationError(`regroup: group name ${g.name} appears twice`);
      names.add(g.name);
      if ((g.sync_mode === 'sync' && g.sync_steps === null) || (g.sync_mode === 'accumulation' && g.accumulation_steps === null)
        || (g.sync_mode === 'adaptive' && g.adaptive_threshold === null)) {
        throw new ValidationError(`regroup: group ${g.name} (${g.sync_mode}) needs ${g.sync_mode === 'sync' ? 'sync_steps' : g.sync_mode === 'accumulation' ? 'accumulation_steps' : 'adaptive_threshold'}`);
      }
      for (const n of g.nodes) {
        if (!workers.has(n)) throw new ValidationError(`regroup: unknown node ${n} in group ${g.name} (the job's workers: ${this.info.workers.join(', ')})`);
        const other = seen.get(n);
        if (other !== undefined) throw new ValidationError(`regroup: node ${n} is in two groups (${other} and ${g.name})`);
        seen.set(n, g.name);
      }
    }
    const absent = this.info.workers.filter((w) => !seen.has(w));
    if (absent.length) throw new ValidationError(`regroup: worker(s) ${absent.join(', ')} missing from the new groups; every worker of the job needs a group`);
  }

  /**
   * Groups from the workers' current speed, k = the current number of groups,
   * the groups keeping their roles: the fastest new group takes the name and
   * sync settings of the currently fastest group, and so on, so a degraded
   * node moves to a slower group.
   *
   * With a profile from every worker: `groupNodes` (k-means on the grouping
   * features) over the profiles with each node's compute divided by its
   * observed slowdown (`observedSlowdown`: recent median step time / its
   * baseline, topology/regroup.ts), so a node that has been throttled since
   * it joined groups with the nodes as slow as it is now; the current groups
   * are ranked by the same scaled compute. When a worker has published no
   * profile (an API worker, an older node): on observed step times alone
   * (`stepTimeGroups`), logged as such.
   */
  speedGroups(): WorkerGroupConfig[] {
    return this.computeGroups().groups;
  }

  /** speedGroups, and what it grouped on. */
  private computeGroups(): { groups: WorkerGroupConfig[]; basis: 'profiles' | 'step_times' } {
    const workers = this.info.workers;
    const missing = workers.filter((w) => !this.profiles.has(w));
    if (missing.length === 0) return { groups: this.profileGroups(), basis: 'profiles' };
    this.o.log.info({ without_profile: missing },
      `regroup: no profile from ${missing.join(', ')}; grouping every worker on its observed step times only`);
    return { groups: this.stepTimeGroups(), basis: 'step_times' };
  }

  /** Recent median step time / baseline, times what was carried over from before the last regroup; 1 while unknown. */
  private slowdownOf(node: string): number {
    return observedSlowdown({
      baselineMs: this.baselines.get(node) ?? null, stepMs: this.steps.get(node) ?? [], window: this.window, carried: this.carriedSlowdown.get(node) ?? 1,
    });
  }

  private async refreshProfiles(): Promise<void> {
    const store = this.o.profileStore ?? null;
    if (store === null) return;
    try {
      for (const [node, t] of await store.getMany(this.info.workers)) this.profiles.set(node, nodeProfileOf(t));
    } catch (e) {
      this.o.log.warn({ err: (e as Error).message }, 'regroup: could not read the profile store; using the profiles seen in telemetry');
    }
  }

  private profileGroups(): WorkerGroupConfig[] {
    const current = this.groups;
    const workers = this.info.workers;
    const slowdown = new Map(workers.map((w) => [w, this.slowdownOf(w)]));
    const scaled = profilesAtObservedSpeed(workers.map((w) => this.profiles.get(w)!), slowdown);
    const speedOf = new Map(scaled.map((p) => [p.node, Math.log(p.matmul_gflops) + Math.log(p.gather_rows_per_s)]));
    const k = Math.max(1, Math.min(current.length, workers.length));
    // groupNodes names its groups fastest first (mean ln matmul + ln gather): the same order as the roles below.
    const grouping = groupNodes(scaled, { k });
    const groupSpeed = (g: WorkerGroupConfig) => {
      const xs = g.nodes.map((n) => speedOf.get(n)).filter((x): x is number => x !== undefined);
      return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : -Infinity;
    };
    const roles = [...current].sort((a, b) => groupSpeed(b) - groupSpeed(a));
    this.o.log.info({ slowdown: Object.fromEntries(slowdown), groups: grouping.groups.map((g) => g.nodes) },
      `regroup on profiles scaled by observed slowdown (k=${grouping.k})`);
    return grouping.groups.map((g, i) => {
      const r = roles[i] ?? roles[roles.length - 1]!;
      return { ...r, nodes: [...g.nodes] };
    });
  }

  /**
   * Groups from observed step times alone: each worker's median recent step
   * time (its current group's median when it has none yet), sorted, cut at
   * the k − 1 largest ratios between neighbours: the optimal 1-D split on
   * log step time into contiguous runs; roles by the groups' median step time.
   */
  private stepTimeGroups(): WorkerGroupConfig[] {
    const current = this.groups;
    const stepOf = new Map<string, number>();
    for (const w of this.info.workers) {
      const a = this.steps.get(w);
      if (a !== undefined && a.length > 0) stepOf.set(w, medianOf(a.slice(-this.window)));
    }
    if (stepOf.size === 0) throw new HetpsError('regroup: no step times observed yet; give the groups explicitly or wait for some training');
    const overall = medianOf([...stepOf.values()]);
    const groupMedian = (g: WorkerGroupConfig) => {
      const xs = g.nodes.map((n) => stepOf.get(n)).filter((x): x is number => x !== undefined);
      return xs.length ? medianOf(xs) : overall;
    };
    for (const g of current) for (const n of g.nodes) if (!stepOf.has(n)) stepOf.set(n, groupMedian(g));
    for (const w of this.info.workers) if (!stepOf.has(w)) stepOf.set(w, overall);
    const sorted = [...stepOf].sort((a, b) => a[1] - b[1] || (a[0] < b[0] ? -1 : 1));
    const k = Math.max(1, Math.min(current.length, sorted.length));
    const gaps = sorted.slice(1).map(([, ms], i) => ({ i: i + 1, r: ms / Math.max(1e-9, sorted[i]![1]) }));
    const cuts = gaps.sort((a, b) => b.r - a.r).slice(0, k - 1).map((g) => g.i).sort((a, b) => a - b);
    const clusters: string[][] = [];
    let from = 0;
    for (const c of [...cuts, sorted.length]) { clusters.push(sorted.slice(from, c).map(([n]) => n)); from = c; }
    const roles = [...current].sort((a, b) => groupMedian(a) - groupMedian(b));
    return clusters.map((nodes, i) => {
      const r = roles[i] ?? roles[roles.length - 1]!;
      return { ...r, nodes: [...nodes] };
    });
  }

  private async autoCheck(): Promise<void> {
    if (this.checking || this.inProgress !== null || this.pausedAt !== null) return;
    this.checking = true;
    try {
      const now = this.o.clock.monotonic();
      const nodes = this.live().flatMap((w) => {
        const b = this.baselines.get(w);
        const a = this.steps.get(w);
        return b === undefined || a === undefined ? [] : [{ node: w, baselineMs: b, stepMs: a }];
      });
      const r = detectDegradation(nodes, now, this.degradation, this.o.policy);
      this.degradation = r.state;
      if (!r.shouldRegroup) return;
      const why = r.degraded.map((d) => `${d.node} at ${d.ratio}× its baseline step time for ${Math.round(d.slowForMs / 1000)} s`).join(', ');
      const reason = `automatic: ${why}`;
      this.o.log.warn({ degraded: r.degraded }, `degradation detected: ${why}; regrouping on observed speed`);
      const reply = await this.regroup(null, reason, 'automatic');
      if (!reply.accepted) {
        this.o.log.info(`regroup not needed: ${reply.note ?? 'grouping unchanged'} (next check after the cooldown)`);
        this.degradation = noteRegrouped(this.degradation, now);
      }
    } catch (e) {
      this.o.log.warn({ err: (e as Error).message }, 'automatic regroup check failed');
      this.degradation = noteRegrouped(this.degradation, this.o.clock.monotonic());
    } finally {
      this.checking = false;
    }
  }
}

function normalized(groups: readonly WorkerGroupConfig[]): string {
  return JSON.stringify([...groups].map((g) => ({ ...g, nodes: [...g.nodes] })).sort((a, b) => (a.name < b.name ? -1 : 1)));
}
