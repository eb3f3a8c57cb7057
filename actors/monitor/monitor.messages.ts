/**
 * The monitor actor's mailbox (`hps.<job>.monitor.main.<op>`) and the job's
 * event telemetry (`hps.<job>.tel.event.<source>`): pauses, resumes,
 * regroups, shutdowns from the scheduler; the monitor adds health verdicts
 * and the workers' pause reports to the same tail.
 */
import { z } from 'zod';
import { decode, encode, telemetrySubject, telemetryWildcard, type Transport } from '../../runtime/mod.ts';

export const EVENT_TELEMETRY_KIND = 'event';

export const jobEventSchema = z.object({
  /** Wall-clock Unix ms. */
  at_ms: z.number(),
  kind: z.enum(['health', 'pause', 'resume', 'paused', 'regroup', 'shutdown', 'worker', 'failover', 'replica_seeding', 'replica_ready', 'shard_lost', 'checkpoint', 'migration']),
  /** The node it is about; null for the whole job. */
  node: z.string().nullable(),
  text: z.string(),
});
export type JobEvent = z.infer<typeof jobEventSchema>;

export const monitorMessages = {
  /** Progress and per-worker figures (one aggregation for status, the progress line and the summary). */
  figures: z.object({}),
  /** The recent events, oldest first. */
  events: z.object({ limit: z.number().int().positive().max(1_000).default(50) }),
};
export type MonitorMessages = typeof monitorMessages;

export function publishEvent(transport: Transport, job: string, source: string, e: Omit<JobEvent, 'at_ms'> & { at_ms?: number }): void {
  try {
    transport.publish(telemetrySubject(job, EVENT_TELEMETRY_KIND, source), encode({ at_ms: e.at_ms ?? Date.now(), ...e }));
  } catch {
    // Best effort, like all telemetry.
  }
}

/** Telemetry of one kind, decoded and validated by `schema`; a message that is not msgpack or does not validate is skipped. */
export function subscribeValidated<T>(transport: Transport, job: string, kind: string, schema: z.ZodType<T>, on: (v: T) => void): () => void {
  const sub = transport.subscribe(telemetryWildcard(job, kind), (m) => {
    let v: unknown;
    try { v = decode(m.data); } catch { return; }
    const r = schema.safeParse(v);
    if (r.success) on(r.data);
  });
  return () => sub.unsubscribe();
}

export function subscribeEvents(transport: Transport, job: string, on: (e: JobEvent) => void): () => void {
  return subscribeValidated(transport, job, EVENT_TELEMETRY_KIND, jobEventSchema, on);
}
