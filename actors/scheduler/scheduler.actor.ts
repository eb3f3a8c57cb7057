/**
 * The scheduler actor: the one writer of the job — job info, groups, plan,
 * pause / regroup state (through its RegroupController) — and the server of
 * the control subjects `hps.<job>.ctl.<command>` (scheduler.messages.ts).
 * It is spawned before the job exists (status says `starting`) and attached
 * to the job once the plan, the batches and the job info are written.
 *
 * `status` gathers: the job info and the controller's state (its own), the
 * health actor's verdicts (`verdicts`), the monitor's figures and events
 * (`figures`, `events`), and every shard's `stats` (1 s each; a shard that
 * does not answer is listed as such).
 */
import { replicaId } from '../shard/replica.ts';
import { controlAddress, DeferredReply, HetpsError, type ActorContext, type ActorDefinition } from '../../runtime/mod.ts';
import type { ShardPlan } from '../../topology/mod.ts';
import type { ShardStats } from '../shard/shard.messages.ts';
import type { JobInfo } from '../store/job-info.ts';
import type { HealthVerdicts } from '../health/health.messages.ts';
import { HEALTH_ACTOR_ID } from '../health/health.actor.ts';
import { MONITOR_ACTOR_ID } from '../monitor/monitor.actor.ts';
import { publishEvent, type JobEvent } from '../monitor/monitor.messages.ts';
import type { LiveFigures } from '../monitor/training-monitor.ts';
import type { RegroupController } from './regroup.ts';
import { schedulerMessages, type JobStatus, type SchedulerMessages } from './scheduler.messages.ts';
import type { Checkpointer } from './checkpointer.ts';
import type { LoadBalancingReport } from './load-balancer.ts';
import type { ShardingReport } from '../node/config-bridge.ts';

export const SCHEDULER_ACTOR_ID = 'main';
/**
 * The most a ctl.checkpoint cut waits for the workers to pause (a checkpoint
 * ahead of it and a regroup in progress included) before it answers with an
 * error naming what it waited for: under the 60 s that `hetps` and the
 * examples' NATS clients wait for a reply, so they hear why.
 */
export const COMMAND_PAUSE_WITHIN_MS = 40_000;

export interface AttachedJob {
  info: () => JobInfo;
  /** The current shard plan (it changes with failovers). */
  plan: () => ShardPlan;
  controller: RegroupController;
  /** Coordinated checkpoints (ctl.checkpoint); absent: the job takes none. */
  checkpointer?: Checkpointer;
  /** Load balancing between the server nodes; absent where it does not run. */
  balancer?: { report(): LoadBalancingReport };
  /** How the plan placed the sparse partitions (hotness sharding's warm-up). */
  sharding?: ShardingReport;
}

export interface SchedulerActorOptions {
  job: string;
  /** ctl.shutdown from a client (not the driver's own end-of-job one): the driver ends the run. */
  onShutdown: (reason: string) => void;
  /** How long status waits for each shard's, the health actor's and the monitor's answer. Default 1 s. */
  statusTimeoutMs?: number;
  /**
   * nats.secure: the servers let only the operator and scheduler users send
   * commands, so a command tells its sender's role (controlSender). Default false.
   */
  secure?: boolean;
}

/**
 * Who sent a control command, as the scheduler logs it. The driver's own
 * commands carry its sender id; every driver of a job (active or standby)
 * is node `driver`. Under access control the servers admit commands only
 * from the operator and scheduler users, so any other sender is the
 * operator. Without it the sender is whoever reached the servers.
 */
export function controlSender(from: string, self: string, secure: boolean): string {
  if (from === self) return 'scheduler (this driver)';
  if (from.startsWith('driver#')) return 'scheduler (another driver)';
  return secure ? 'operator' : 'unauthenticated client (nats.secure is off)';
}

export type SchedulerActorDefinition = ActorDefinition<SchedulerMessages> & {
  attach(job: AttachedJob): void;
  /** The run has ended (status says done) or is stopping. */
  setEnded(state: 'stopping' | 'done'): void;
};

export function createSchedulerActor(o: SchedulerActorOptions): SchedulerActorDefinition {
  let attached: AttachedJob | null = null;
  let ended: 'stopping' | 'done' | null = null;
  const timeoutMs = o.statusTimeoutMs ?? 1_000;
  const secure = o.secure ?? false;
  const event = (c: ActorContext, kind: JobEvent['kind'], text: string, from: string) => {
    const by = controlSender(from, c.system.senderId, secure);
    publishEvent(c.system.transport, o.job, 'scheduler', { at_ms: c.clock.now(), kind, node: null, text: `${text} [by ${by}, ${from}]` });
  };
  /** The commands in progress and queued, one after another; status is not one of them. */
  let commands: Promise<unknown> = Promise.resolve();
  /**
   * Every command is logged with its sender; status (asked every second by
   * the dashboard) at debug only. Commands take turns, in the order they
   * arrived, outside the mailbox: a command that takes long (a checkpoint's
   * cut, a recover) holds the next command, not `status`.
   */
  const loggedAll = (handlers: ActorDefinition<SchedulerMessages>['handlers']): ActorDefinition<SchedulerMessages>['handlers'] => {
    const out: Record<string, (m: { from: string }, c: ActorContext) => unknown> = {};
    for (const [command, h] of Object.entries(handlers)) {
      const handle = h as (m: { from: string }, c: ActorContext) => unknown;
      out[command] = (m, c) => {
        const sender = controlSender(m.from, c.system.senderId, secure);
        const fields = { command, sender, client: m.from, secure };
        if (command === 'status') {
          c.log.debug(fields, 'control command');
          return handle(m, c);
        }
        c.log.info(fields, `control command ${command} from ${sender} (${m.from})`);
        const d = new DeferredReply();
        const run = commands.then(() => handle(m, c));
        commands = run.catch(() => undefined);
        run.then((r) => d.resolve(r), (e: unknown) => d.reject(e));
        return d;
      };
    }
    return out as unknown as ActorDefinition<SchedulerMessages>['handlers'];
  };
  const need = (what: string): AttachedJob => {
    if (attached === null) throw new HetpsError(`${what}: the job is still starting (no job info yet); try again in a moment`);
    return attached;
  };

  /** Status answers being gathered, by events limit. */
  const gathering = new Map<number, Promise<JobStatus>>();
  const status = async (c: ActorContext, eventsLimit: number): Promise<JobStatus> => {
    const ask = <R>(kind: 'health' | 'monitor', id: string, type: string, fields: Record<string, unknown> = {}) =>
      c.system.ref(kind, id).request<R & Record<string, unknown>>(type, fields, { timeoutMs }).catch(() => null);
    const [health, figures, events] = await Promise.all([
      ask<HealthVerdicts>('health', HEALTH_ACTOR_ID, 'verdicts'),
      ask<LiveFigures>('monitor', MONITOR_ACTOR_ID, 'figures'),
      ask<{ events: JobStatus['events'] }>('monitor', MONITOR_ACTOR_ID, 'events', { limit: Math.max(1, eventsLimit) }),
    ]);
    const verdict = new Map((health?.nodes ?? []).map((n) => [n.node, n]));
    const a = attached;
    const info = a?.info() ?? null;
    const nodeState = (node: string): string => {
      const v = verdict.get(node);
      if (v === undefined) return 'unknown';
      return v.state === 'alive' ? v.reported : v.state;
    };
    const groupOf = new Map<string, string>();
    for (const g of info?.groups ?? []) for (const n of g.nodes) groupOf.set(n, g.name);
    const plan = a?.plan() ?? null;
    const shards = await Promise.all((plan?.shards ?? []).map(async (shard) => {
      const r = plan!.placement.replicas[shard]!;
      const st = await c.system.ref('shard', replicaId(shard, r.primary)).request<ShardStats & { replica_lag?: Record<string, number> } & Record<string, unknown>>('stats', {}, { timeoutMs }).catch(() => null);
      const hb = verdict.get(r.primary);
      return {
        shard, primary: r.primary, backups: [...r.backups], seeding: [...r.seeding], replica_lag: st?.replica_lag ?? null,
        state: st === null ? (hb?.state === 'alive' || hb === undefined ? 'not answering' : hb.state) : (hb?.state ?? 'alive'),
        version: st?.version ?? null, rows: st === null ? null : Object.values(st.sparse_rows).reduce((x, y) => x + y, 0),
        bytes: st?.bytes ?? null, pulls: st?.pulls ?? null, pushes: st?.pushes ?? null, last_heartbeat_ms: hb?.last_heartbeat_ms ?? null,
      };
    }));
    const p = figures?.progress;
    return {
      job: o.job, run_id: info?.run_id ?? null, mode: info?.mode ?? null,
      state: ended ?? (a === null ? 'starting' : a.controller.state),
      plan_version: plan?.version ?? null,
      groups: (info?.groups ?? []).map((g) => ({ name: g.name, sync_mode: g.sync_mode, members: g.nodes.map((node) => ({ node, state: nodeState(node) })) })),
      workers: (info?.workers ?? []).map((node) => {
        const f = figures?.workers[node];
        return {
          node, group: groupOf.get(node) ?? null, state: nodeState(node), health: verdict.get(node)?.state ?? null,
          steps: f?.steps ?? 0, samples: f?.samples ?? 0, samples_per_s: f?.samples_per_s ?? 0, utilisation: f?.utilisation ?? null, last_heartbeat_ms: verdict.get(node)?.last_heartbeat_ms ?? null,
          held: f?.held ?? null, held_count: f?.held_count ?? null,
        };
      }),
      shards,
      progress: { samples: p?.samples ?? 0, batches_acked: p?.batches_acked ?? 0, batches_total: info?.total_batches ?? null, samples_per_s: p?.samples_per_s ?? 0, loss: p?.loss ?? null },
      load_balancing: a?.balancer?.report() ?? null,
      sharding: a?.sharding ?? null,
      regroups: a?.controller.records ?? [],
      events: events?.events ?? [],
    };
  };

  return {
    kind: 'scheduler',
    id: SCHEDULER_ACTOR_ID,
    address: controlAddress(o.job),
    messages: schedulerMessages,
    attach(job) { attached = job; },
    setEnded(state) { ended = state; },
    handlers: loggedAll({
      // Read-only, and asked often (the dashboard, /metrics, operators): answered beside a command in progress (a
      // checkpoint's cut, a recover), not after it, and requests arriving while one is gathered share its answer.
      status: (m, c) => {
        let p = gathering.get(m.events);
        if (p === undefined) {
          const g = status(c, m.events).finally(() => { gathering.delete(m.events); });
          gathering.set(m.events, g);
          p = g;
        }
        const d = new DeferredReply();
        p.then((r) => d.resolve(r), (e: unknown) => d.reject(e));
        return d;
      },
      pause: async (m, c) => {
        const r = await need('pause').controller.pause(m.reason);
        if (!r.already) event(c, 'pause', `pause requested (${m.reason}): workers stop at their next boundary (groups v${r.groups_version})`, m.from);
        return r;
      },
      resume: async (m, c) => {
        const r = await need('resume').controller.resume();
        event(c, 'resume', `resumed after ${r.paused_s.toFixed(1)} s paused`, m.from);
        return r;
      },
      regroup: async (m, c) => {
        const r = await need('regroup').controller.regroup(m.groups, m.reason, 'command');
        if (r.accepted) event(c, 'regroup', `regroup to groups v${r.groups_version} (${m.reason})`, m.from);
        return r;
      },
      recover: async (m, c) => {
        const r = await need('recover').controller.recover(m.reason);
        event(c, 'regroup', `recover: every group re-forms (groups v${r.groups_version}, ${m.reason})`, m.from);
        return r;
      },
      checkpoint: async (m, c) => {
        const k = need('checkpoint').checkpointer;
        // After training the job's state no longer changes: its end-of-job checkpoint (checkpoint.at_end) holds it.
        if (ended !== null) throw new HetpsError(`checkpoint: the job has ended (it is ${ended}); its end-of-job checkpoint (checkpoint.at_end) holds the final state`);
        if (k === undefined) throw new HetpsError('checkpoint: this job takes no checkpoints');
        // A plain NATS client and `hetps` wait 60 s for the reply: a command's cut gives up on the pause well before that, saying why.
        const r = await k.take(m.trigger, m.path, m.trigger === 'command' ? { pauseWithinMs: COMMAND_PAUSE_WITHIN_MS } : {});
        event(c, 'checkpoint', `checkpoint ${r.name}: ${r.files} files, ${r.bytes} bytes, ${r.batches_done} batches done; paused ${r.pause_ms} ms`, m.from);
        return { ...r };
      },
      shutdown: (m, c) => {
        // The driver's own end-of-job shutdown reaches its scheduler too: nothing to do then.
        if (m.from === c.system.senderId) return { stopping: true };
        const info = attached?.info() ?? null;
        if (m.run_id !== null && info !== null && m.run_id !== info.run_id) return { stopping: false, note: `run ${m.run_id} is not this run (${info.run_id})` };
        event(c, 'shutdown', `shutdown requested: ${m.reason}`, m.from);
        ended = 'stopping';
        o.onShutdown(m.reason);
        return { stopping: true };
      },
    }),
  };
}
