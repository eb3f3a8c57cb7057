/**
 * The health actor: turns heartbeats into verdicts — alive → suspect → dead
 * (the rule: topology/health.ts) — and publishes every transition on
 * `hps.<job>.tel.health.<node>` as `{ node, role, state, since_ms, reason }`.
 * Its mailbox answers `verdicts` (every node now, for a late listener and
 * for `ctl.status`) and takes `exited` from whoever saw a node's process
 * end, which makes it dead at once. One per job, next to the scheduler.
 */
import {
  JSON_CONTENT_TYPE, decode, heartbeatWildcard, telemetrySubject, encode,
  type ActorContext, type ActorDefinition, type Logger, type RawSubscription, type Timer, type TransportMsg,
} from '../../runtime/mod.ts';
import { observerStalled, onExit, onHeartbeat, onTick, type HealthPolicy, type NodeHealth } from '../../topology/mod.ts';
import { healthMessages, heartbeatSchema, type HealthMessages, type HealthVerdictMessage, type HealthVerdicts } from './health.messages.ts';

export const HEALTH_ACTOR_ID = 'main';
export const HEALTH_TELEMETRY_KIND = 'health';

export interface HealthActorOptions {
  policy: HealthPolicy;
  /** Every transition, after it is published (the monitor's events, logs). */
  onVerdict?: (v: HealthVerdictMessage) => void;
}

export type HealthActorDefinition = ActorDefinition<HealthMessages> & {
  /** Verdicts now (same process). */
  verdicts(): HealthVerdicts;
  /** One node's verdict now (same process); null: not heard of. */
  stateOf(node: string): NodeHealth['state'] | null;
  /**
   * Every verdict change, in this process (a HealthView). A node that came
   * back as a new process (another incarnation) is reported dead first:
   * whatever it held in memory is gone.
   */
  onChange(listener: (node: string, state: NodeHealth['state']) => void): () => void;
};

export function createHealthActor(o: HealthActorOptions): HealthActorDefinition {
  const nodes = new Map<string, NodeHealth>();
  const listeners = new Set<(node: string, state: NodeHealth['state']) => void>();
  let sub: { unsubscribe(): void } | null = null;
  let ticker: Timer | null = null;
  let context: ActorContext | null = null;
  let rejectedHeartbeats = 0;

  const wireOf = (h: NodeHealth, c: ActorContext): HealthVerdictMessage => ({
    node: h.node, role: h.role, state: h.state, since_ms: Math.round(c.clock.now() - (c.clock.monotonic() - h.sinceMs)),
    reason: h.reason, reported: h.reported, silent_ms: Math.max(0, Math.round(c.clock.monotonic() - h.lastHeartbeatMs)),
  });

  const update = (c: ActorContext, next: NodeHealth, prev: NodeHealth | null) => {
    nodes.set(next.node, next);
    if (prev !== null && prev.state === next.state && prev.incarnation === next.incarnation) return;
    const v = wireOf(next, c);
    log(c.log, v, prev);
    try {
      c.system.transport.publish(telemetrySubject(c.system.job, HEALTH_TELEMETRY_KIND, next.node), encode(v));
    } catch (e) {
      c.log.warn({ err: (e as Error).message, node: next.node }, 'could not publish a health verdict');
    }
    o.onVerdict?.(v);
    const restarted = prev !== null && prev.incarnation !== next.incarnation && prev.state !== 'dead';
    for (const l of listeners) {
      if (restarted) l(next.node, 'dead');
      l(next.node, next.state);
    }
  };

  const onBeat = (c: ActorContext, m: TransportMsg) => {
    let body: unknown;
    try {
      body = m.headers?.['Content-Type'] === JSON_CONTENT_TYPE ? JSON.parse(new TextDecoder().decode(m.data)) : decode(m.data);
    } catch {
      rejectedHeartbeats++;
      return;
    }
    const r = heartbeatSchema.safeParse(body);
    if (!r.success) {
      // Counted, and said once in a while: a malformed heartbeat must not make a node look alive.
      if (rejectedHeartbeats++ % 100 === 0) c.log.warn({ subject: m.subject, issues: r.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`) }, 'malformed heartbeat ignored');
      return;
    }
    const prev = nodes.get(r.data.node) ?? null;
    update(c, onHeartbeat(prev, r.data, c.clock.monotonic()), prev);
  };

  let lastTick: number | null = null;
  let graceUntil = 0;
  const tick = (c: ActorContext) => {
    const now = c.clock.monotonic();
    const prev = lastTick;
    lastTick = now;
    if (prev !== null && observerStalled(prev, now, tickMs, o.policy)) {
      c.log.warn({ late_ms: Math.round(now - prev - tickMs) }, 'health: this process was held up; judging again once the heartbeats queued meanwhile are in');
      graceUntil = now + o.policy.heartbeatMs;
    }
    if (now < graceUntil) return;
    for (const h of [...nodes.values()]) update(c, onTick(h, now, o.policy), h);
  };
  const tickMs = Math.max(10, Math.min(100, Math.floor(o.policy.heartbeatMs / 2)));

  const verdicts = (): HealthVerdicts => {
    const c = context;
    if (c === null) return { nodes: [] };
    return {
      nodes: [...nodes.values()].sort((a, b) => (a.node < b.node ? -1 : 1)).map((h) => ({
        ...wireOf(h, c), last_heartbeat_ms: Math.round(c.clock.monotonic() - h.lastHeartbeatMs),
      })),
    };
  };

  return {
    kind: 'health',
    id: HEALTH_ACTOR_ID,
    messages: healthMessages,
    verdicts,
    stateOf: (node) => nodes.get(node)?.state ?? null,
    onChange(listener) {
      listeners.add(listener);
      return () => { listeners.delete(listener); };
    },
    onStart(c) {
      context = c;
      sub = c.system.transport.subscribe(heartbeatWildcard(c.system.job), (m) => onBeat(c, m)) as RawSubscription;
      // Ticks well inside a heartbeat period, so a verdict is late by at most one tick.
      ticker = c.clock.setInterval(() => tick(c), tickMs);
    },
    onStop() {
      ticker?.cancel();
      sub?.unsubscribe();
    },
    handlers: {
      verdicts: () => verdicts(),
      exited: (m, c) => {
        const h = nodes.get(m.node);
        if (h === undefined) return { known: false };
        update(c, onExit(h, c.clock.monotonic(), m.how), h);
        return { known: true };
      },
    },
  };
}

function log(l: Logger, v: HealthVerdictMessage, prev: NodeHealth | null): void {
  if (v.reason.startsWith('left')) {
    // A normal end: dead to the job, nothing to worry about.
    l.info({ node: v.node, state: v.state }, `health: ${v.role} ${v.node} left (it stopped)`);
    return;
  }
  const text = `health: ${v.role} ${v.node} is ${v.state}${prev ? ` (was ${prev.state})` : ''}: ${v.reason}`;
  if (v.state === 'alive') l.info({ node: v.node, state: v.state }, text);
  else l.warn({ node: v.node, state: v.state, reason: v.reason }, text);
}
