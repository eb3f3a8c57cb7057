/**
 * The job's control plane in the driver's process: the health actor (heartbeats →
 * verdicts), the monitor actor (the one aggregation of telemetry), the
 * scheduler actor (the one writer of the job, serving `hps.<job>.ctl.*`),
 * and the process's own heartbeat (role scheduler). Started before any node,
 * so every heartbeat and every report is seen; stopped before the nodes are
 * told to shut down.
 *
 * A standby driver starts it only once it holds the job's scheduler lease
 * (lease.ts): two schedulers would both answer `ctl.*` and two health actors
 * both publish verdicts. Its monitor, though, must have counted every
 * acknowledgement since the job began: it makes the monitor definition when
 * it starts (`createMonitorActor` subscribes to the telemetry as it is made,
 * its mailbox only comes with the spawn) and hands it over as `monitor`.
 */
import type { Actor, ActorSystem, Logger, NatsAuth, NatsTls } from '../../runtime/mod.ts';
import type { GradientCompressionSetting, HealthPolicy } from '../../topology/mod.ts';
import { createHealthActor, type HealthActorDefinition } from '../health/health.actor.ts';
import { HeartbeatPublisher, ThreadedHeartbeat } from '../health/heartbeat.ts';
import { HEALTH_ACTOR_ID } from '../health/health.actor.ts';
import { createMonitorActor, type MonitorActorDefinition } from '../monitor/monitor.actor.ts';
import { createSchedulerActor, type SchedulerActorDefinition } from './scheduler.actor.ts';
import { JobWatch, MonitorServer } from '../monitor/monitor-http.ts';

export interface ControlPlane {
  health: HealthActorDefinition;
  monitor: MonitorActorDefinition;
  scheduler: SchedulerActorDefinition;
  /** Snapshots of the job every second: the dashboard's, `/metrics`' and the run's telemetry log. */
  watch: JobWatch;
  /** The dashboard and `/metrics` (monitoring.port); null when off or when the port could not be had. */
  server: MonitorServer | null;
  /** A node process exited (seen by its parent): dead at once. */
  nodeExited(node: string, how: string): void;
  stop(): Promise<void>;
}

export async function startControlPlane(system: ActorSystem, o: {
  policy: HealthPolicy; log: Logger; onShutdown: (reason: string) => void;
  /** The NATS cluster, for a heartbeat from a thread of its own; null: the in-process bus (heartbeat on the main thread). */
  nats: { servers: string[]; auth: NatsAuth | null; tls: NatsTls | null } | null;
  /** A monitor made (and listening) before now, not spawned yet; absent: a new one. */
  monitor?: MonitorActorDefinition | null;
  /** Where the monitor serves the dashboard and `/metrics`; null or absent: nowhere. */
  http?: { port: number; host: string; token: string | null } | null;
  /** Told the dashboard's URL once it listens, and (with a token) the URL to open. */
  onServing?: (url: string, loginUrl: string) => void;
  /** Append every snapshot to this file (`<run dir>/telemetry.jsonl`, for `hetps report`); null or absent: kept in memory only. */
  telemetryLog?: string | null;
  /** nats.secure: the servers enforce who may send commands, so the scheduler logs each one's sender role. */
  secure?: boolean;
  /** communication.compression as the workers apply it (gradientCompressionFromConfig), for the dashboard's wire line; null or absent: float32. */
  compression?: GradientCompressionSetting | null;
}): Promise<ControlPlane> {
  const health = createHealthActor({ policy: o.policy });
  const monitor = o.monitor ?? createMonitorActor({ transport: system.transport, job: system.job, clock: system.clock, log: o.log });
  const scheduler = createSchedulerActor({ job: system.job, onShutdown: o.onShutdown, secure: o.secure ?? false });
  const actors: Actor<never>[] = [];
  for (const def of [health, monitor, scheduler] as const) actors.push(await system.spawn(def as never) as Actor<never>);
  const beat = { job: system.job, node: system.node, role: 'scheduler' as const, incarnation: system.senderId, periodMs: o.policy.heartbeatMs, clock: system.clock, state: () => 'running' };
  const heartbeat = o.nats !== null
    ? new ThreadedHeartbeat({ ...beat, ...o.nats })
    : new HeartbeatPublisher({ ...beat, transport: system.transport }).start();
  const watch = new JobWatch({ job: system.job, transport: system.transport, monitor, recordTo: o.telemetryLog ?? null, compression: o.compression ?? null });
  let server: MonitorServer | null = null;
  if (o.http) {
    try {
      server = await MonitorServer.start({ port: o.http.port, host: o.http.host, token: o.http.token, job: system.job, transport: system.transport, watch, log: o.log });
      o.onServing?.(server.url, server.loginUrl);
    } catch (e) {
      o.log.warn({ port: o.http.port, err: (e as Error).message },
        `no dashboard: cannot listen on ${o.http.host}:${o.http.port} (${(e as Error).message}); give another port with --monitor-port N (0: off), or monitoring.port`);
    }
  }
  let stopped = false;
  return {
    health, monitor, scheduler, watch, server,
    nodeExited(node, how) {
      void system.ref('health', HEALTH_ACTOR_ID).request('exited', { node, how }).catch(() => undefined);
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      // The page keeps its last state: the stream says the job ended before the server goes.
      await watch.end().catch(() => undefined);
      await server?.close().catch(() => undefined);
      await heartbeat.stop(true);
      // The scheduler first: no command may start while the rest goes away.
      for (const a of [...actors].reverse()) await system.despawn(a).catch(() => undefined);
    },
  };
}
