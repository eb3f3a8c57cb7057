/**
 * What the health actor says of a node, and how others read it. Everyone
 * acts on these verdicts (`hps.<job>.tel.health.<node>`), nobody on silence
 * of their own.
 *
 * States:
 * - `alive`   heartbeats arrive;
 * - `suspect` no heartbeat for more than two periods: maybe slow, maybe gone;
 * - `dead`    no heartbeat for `fault_tolerance.dead_after_ms`, or its process exit was seen.
 */
export type HealthState = 'alive' | 'suspect' | 'dead';
export const HEALTH_STATES: readonly HealthState[] = ['alive', 'suspect', 'dead'];

export type NodeRole = 'worker' | 'shard' | 'scheduler';

/** A node's current verdict, as any actor that listens on the health telemetry sees it. */
export interface HealthView {
  /** The node's latest verdict; null when the health actor has said nothing of it yet. */
  stateOf(node: string): HealthState | null;
  /** Called on every verdict change; returns the unsubscribe function. */
  onChange(listener: (node: string, state: HealthState) => void): () => void;
}
