/**
 * The monitor actor: the one aggregation of a job's telemetry. It owns the
 * `TrainingMonitor` (exactly-once accounting, progress, utilisation, curve)
 * that the driver's progress line and summary read, and keeps the job's
 * event tail (scheduler events, health verdicts, workers pausing and
 * resuming). Its mailbox answers `figures` and `events`, which `ctl.status`
 * reads; the dashboard and `/metrics` will read the same.
 */
import type { ActorDefinition, Clock, Logger, Transport } from '../../runtime/mod.ts';
import { healthVerdictSchema, type HealthVerdictMessage } from '../health/health.messages.ts';
import { HEALTH_TELEMETRY_KIND } from '../health/health.actor.ts';
import { subscribeTelemetry } from './telemetry.ts';
import { monitorMessages, subscribeEvents, subscribeValidated, type JobEvent, type MonitorMessages } from './monitor.messages.ts';
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

/** The health actor's verdicts (`tel.health.<node>`), validated; malformed ones are skipped. */
export function subscribeVerdicts(transport: Transport, job: string, on: (v: HealthVerdictMessage) => void): () => void {
  return subscribeValidated(transport, job, HEALTH_TELEMETRY_KIND, healthVerdictSchema, on);
}

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
  unsubs.push(subscribeVerdicts(o.transport, o.job, (v) => add({ at_ms: v.since_ms, kind: 'health', node: v.node, text: `${v.role} ${v.node} ${v.state}: ${v.reason}` })));
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
