/**
 * Health verdicts from heartbeats, as plain functions over plain data: the
 * health actor keeps one `NodeHealth` per node and calls these on every
 * heartbeat and every tick; tests drive them with a simulated clock.
 *
 * The rule:
 * - a heartbeat makes a node `alive` (a new incarnation too: a restarted process);
 * - no heartbeat for more than `suspectAfterMs` (two periods, or half the
 *   dead time if that is larger): `suspect` — a GC pause or a busy link,
 *   maybe a dying process; nobody acts on it yet;
 * - no heartbeat for `deadAfterMs`: `dead`;
 * - a process exit seen by whoever started it: `dead` at once;
 * - a node that says it is leaving (its last heartbeat, state `stopped`):
 *   `dead` at once with reason `left`, so nobody waits for it.
 * Dead is not final: a heartbeat after it makes the node alive again.
 */
export type HealthVerdict = 'alive' | 'suspect' | 'dead';

export interface HealthPolicy {
  /** fault_tolerance.heartbeat_ms */
  heartbeatMs: number;
  /** fault_tolerance.dead_after_ms */
  deadAfterMs: number;
}

export const DEFAULT_HEALTH_POLICY: Readonly<HealthPolicy> = Object.freeze({ heartbeatMs: 250, deadAfterMs: 1_000 });

/** Silence after which a node is suspect: two heartbeat periods, or half the dead time if that is longer, and always before dead. */
export function suspectAfterMs(p: HealthPolicy): number {
  return Math.min(p.deadAfterMs - 1, Math.max(2 * p.heartbeatMs, Math.floor(p.deadAfterMs / 2)));
}

export interface NodeHealth {
  node: string;
  role: string;
  incarnation: string;
  state: HealthVerdict;
  /** Monotonic ms when `state` began. */
  sinceMs: number;
  /** Monotonic ms of the last heartbeat. */
  lastHeartbeatMs: number;
  /** The node's own state in its last heartbeat (training, paused, …). */
  reported: string;
  seq: number;
  reason: string;
}

export interface Heartbeat {
  node: string;
  role: string;
  incarnation: string;
  state: string;
  seq: number;
}

/** A node's own state on its last heartbeat before it exits normally. */
export const LEAVING_STATE = 'stopped';

/** The health after a heartbeat arrived at `now`; `prev` null for a node not seen before. */
export function onHeartbeat(prev: NodeHealth | null, hb: Heartbeat, now: number): NodeHealth {
  const leaving = hb.state === LEAVING_STATE;
  const restarted = prev !== null && prev.incarnation !== hb.incarnation;
  // A late heartbeat of an old incarnation says nothing about the process that replaced it.
  if (prev !== null && !restarted && hb.seq <= prev.seq && prev.state !== 'alive') return prev;
  const state: HealthVerdict = leaving ? 'dead' : 'alive';
  const changed = prev === null || prev.state !== state;
  const reason = leaving ? 'left: the node stopped'
    : prev === null ? 'first heartbeat'
      : restarted ? `restarted (incarnation ${hb.incarnation})`
        : changed ? `heartbeats again after ${Math.round(now - prev.lastHeartbeatMs)} ms` : prev.reason;
  return {
    node: hb.node, role: hb.role, incarnation: hb.incarnation, state,
    sinceMs: changed || restarted ? now : prev!.sinceMs, lastHeartbeatMs: now, reported: hb.state, seq: hb.seq, reason,
  };
}

/** The health at `now` with no heartbeat since the last one. */
export function onTick(h: NodeHealth, now: number, p: HealthPolicy): NodeHealth {
  if (h.state === 'dead') return h;
  const silent = now - h.lastHeartbeatMs;
  if (silent >= p.deadAfterMs) {
    return { ...h, state: 'dead', sinceMs: now, reason: `no heartbeat for ${Math.round(silent)} ms (dead after ${p.deadAfterMs} ms)` };
  }
  if (h.state === 'alive' && silent > suspectAfterMs(p)) {
    return { ...h, state: 'suspect', sinceMs: now, reason: `no heartbeat for ${Math.round(silent)} ms` };
  }
  return h;
}

/** The process of `h` exited (seen by its parent): dead at once. */
export function onExit(h: NodeHealth, now: number, how: string): NodeHealth {
  if (h.state === 'dead' && h.reason.startsWith('left')) return h;
  return { ...h, state: 'dead', sinceMs: now, reason: `process exited (${how})` };
}

/**
 * The health actor itself was held up (its process busy, its machine
 * overloaded): its tick came more than a heartbeat period late. Heartbeats
 * that arrived meanwhile are still queued behind the tick, so judging now
 * would call every node silent; it waits one period for them instead.
 */
export function observerStalled(prevTickMs: number, nowMs: number, tickMs: number, p: HealthPolicy): boolean {
  return nowMs - prevTickMs > tickMs + p.heartbeatMs;
}
