/**
 * The monitor actor: the one aggregation of a job's telemetry. It owns the
 * `TrainingMonitor` (exactly-once accounting, progress, utilisation, curve)
 * that the driver's progress line and summary read, and keeps the job's
 * event tail (scheduler events, health verdicts, workers pausing and
 * resuming). Its mailbox answers `figures` and `events`, which `ctl.status`
 * reads; the dashboard and `/metrics` will read the same.
 */
import { decode, telemetryWildcard, type ActorDefinition, type Clock, type Logger, type Transport } from '../../runtime/mod.ts';
import { healthVerdictSchema } from '../health/health.messages.ts';
import { HEALTH_TELEMETRY_KIND } from '../health/health.actor.ts';
import { subscribeTelemetry } from './telemetry.ts';
import { monitorMessages, subscribeEvents, type JobEvent, type MonitorMessages } from './monitor.messages.ts';
import { TrainingMonitor, type LiveFigures } from './training-monitor.ts';

export const MONITOR_ACTOR_ID = 'main';
const KEEP_EVENTS = 1_000;

export type MonitorActorDefinition = ActorDefinition<MonitorMessages> & {
  readonly training: TrainingMonitor;
  /** Total batches of the job once it is created (status shows n / total). */
  setTotalBatches(n: number): void;
  figures(): LiveFigures;
  events(limit?: number): JobEvent[];
};

export function createMonitorActor(o: { transport: Transport; job: string; clock: Clock; log: Logger }): MonitorActorDefinition {
  // Subscribed from construction: nodes may report before the job exists.
  const training = new TrainingMonitor(o.transport, o.job, o.clock, o.log);
  const tail: JobEvent[] = [];
  let total: number | null = null;
  const add = (e: JobEvent) => {
    tail.push(e);
    if (tail.length > KEEP_EVENTS) tail.splice(0, tail.length - KEEP_EVENTS);
  };
  const unsubs: (() => void)[] = [
    subscribeEvents(o.transport, o.job, add),
    subscribeTelemetry(o.transport, o.job, {
      regroup: (t) => add({
        at_ms: o.clock.now(), kind: 'worker', node: t.node,
        text: t.state === 'ready' ? `${t.node} paused (groups v${t.groups_version})` : `${t.node} resumed in group ${t.group} (groups v${t.groups_version})`,
      }),
    }),
  ];
  const healthSub = o.transport.subscribe(telemetryWildcard(o.job, HEALTH_TELEMETRY_KIND), (m) => {
    let v: unknown;
    try { v = decode(m.data); } catch { return; }
    const r = healthVerdictSchema.safeParse(v);
    if (r.success) add({ at_ms: r.data.since_ms, kind: 'health', node: r.data.node, text: `${r.data.role} ${r.data.node} ${r.data.state}: ${r.data.reason}` });
  });
  unsubs.push(() => healthSub.unsubscribe());
  const figures = () => training.liveFigures(total);
  const events = (limit = 50) => tail.slice(-limit);
  return {
    kind: 'monitor',
    id: MONITOR_ACTOR_ID,
    messages: monitorMessages,
    training,
    setTotalBatches(n) { total = n; },
    figures,
    events,
    onStop() {
      for (const u of unsubs) u();
      training.dispose();
    },
    handlers: {
      figures: () => figures(),
      events: (m) => ({ events: events(m.limit) }),
    },
  };
}
