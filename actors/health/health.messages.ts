/**
 * Heartbeats (`hps.<job>.hb.<node>`, msgpack or JSON) and health verdicts
 * (`hps.<job>.tel.health.<node>`, msgpack), and the health actor's mailbox
 * (`hps.<job>.health.<id>.<op>`).
 */
import { z } from 'zod';
import { HEALTH_STATES } from './health.types.ts';

export const heartbeatSchema = z.object({
  node: z.string().min(1),
  role: z.enum(['worker', 'shard', 'scheduler']),
  /** Distinguishes this process from an earlier one of the same node. */
  incarnation: z.string().min(1),
  /** The node's own state (a worker: training, paused, …; `stopped` on its last heartbeat before a normal exit). */
  state: z.string().min(1),
  seq: z.number().int().nonnegative(),
});
export type HeartbeatMessage = z.infer<typeof heartbeatSchema>;

export const healthVerdictSchema = z.object({
  node: z.string().min(1),
  role: z.string(),
  state: z.enum(HEALTH_STATES as ['alive', 'suspect', 'dead']),
  /** Wall-clock time (Unix ms) at which the node entered this state. */
  since_ms: z.number(),
  reason: z.string(),
  /** The node's own state in its last heartbeat. */
  reported: z.string().default(''),
  /** Milliseconds since its last heartbeat when the verdict was made. */
  silent_ms: z.number().nonnegative().default(0),
});
export type HealthVerdictMessage = z.infer<typeof healthVerdictSchema>;

export const healthMessages = {
  /** Every node's current verdict. */
  verdicts: z.object({}),
  /** The process of `node` exited (its parent saw it): dead at once. */
  exited: z.object({ node: z.string().min(1), how: z.string().default('exited') }),
};
export type HealthMessages = typeof healthMessages;

export interface HealthVerdicts {
  nodes: (HealthVerdictMessage & { last_heartbeat_ms: number | null })[];
}
