/**
 * When a worker group runs a sync round: the configured strategy as a plain
 * object, and `shouldSync`, the pure rule the group machine uses as its guard.
 *
 * This is policy over plain data (no clock, no I/O), so it could live in
 * `topology/`; it sits next to the machine for now because the machine is its
 * only user.
 */
import { ValidationError } from '../../runtime/mod.ts';
import type { SyncMode, WorkerGroupConfig } from '../../topology/mod.ts';

/**
 * A group's sync strategy (camelCase mirror of `cluster.worker_groups[]`).
 * Exactly the parameter of the chosen mode is set; the others are null.
 */
export interface SyncPolicy {
  syncMode: SyncMode;
  /** `sync`: a round every `syncSteps` steps of every member. */
  syncSteps: number | null;
  /** `accumulation`: each member accumulates this many gradients, then a round. */
  accumulationSteps: number | null;
  /** `adaptive`: a round once the fastest member leads the slowest by this many steps. */
  adaptiveThreshold: number | null;
  /**
   * `adaptive` only: the most steps the fastest member may take between rounds;
   * null: no bound, so a group whose members never drift apart never syncs.
   * The YAML has no key for it yet (`syncPolicyFromConfig` sets null).
   */
  adaptiveMaxSteps: number | null;
}

/** The group's policy from the parsed config. */
export function syncPolicyFromConfig(group: WorkerGroupConfig): SyncPolicy {
  return {
    syncMode: group.sync_mode,
    syncSteps: group.sync_steps,
    accumulationSteps: group.accumulation_steps,
    adaptiveThreshold: group.adaptive_threshold,
    adaptiveMaxSteps: null,
  };
}

const isPositiveInt = (n: number | null): n is number => n !== null && Number.isInteger(n) && n > 0;

/** Throws ValidationError unless the parameter the mode needs is a positive integer. */
export function validateSyncPolicy(policy: SyncPolicy, where: string): SyncPolicy {
  const need = { sync: 'syncSteps', accumulation: 'accumulationSteps', adaptive: 'adaptiveThreshold', async: null } as const;
  const key = need[policy.syncMode];
  if (key === undefined) throw new ValidationError(`${where}: unknown sync mode ${JSON.stringify(policy.syncMode)}`, { data: { policy } });
  if (key !== null && !isPositiveInt(policy[key])) {
    throw new ValidationError(`${where}: sync mode ${policy.syncMode} needs ${key} as a positive integer, got ${policy[key]}`, { data: { policy } });
  }
  if (policy.adaptiveMaxSteps !== null && !isPositiveInt(policy.adaptiveMaxSteps)) {
    throw new ValidationError(`${where}: adaptiveMaxSteps must be a positive integer or null, got ${policy.adaptiveMaxSteps}`, { data: { policy } });
  }
  return policy;
}

/** What `shouldSync` reads; the group machine's context has all of it. */
export interface SyncProgress {
  policy: SyncPolicy;
  members: readonly string[];
  /** Members that cannot take part right now (partitioned or lost). */
  lost: readonly string[];
  /** Steps each member completed since the group's last common point (round start, resync, forming). */
  stepsSinceSync: Readonly<Record<string, number>>;
}

/** Members that take part in a round: the membership minus the lost ones. */
export function activeMembers(p: Pick<SyncProgress, 'members' | 'lost'>): string[] {
  return p.members.filter((m) => !p.lost.includes(m));
}

/**
 * True when the group should start a sync round now:
 * - `sync`: every active member has done `syncSteps` steps since the last round (a barrier);
 * - `accumulation`: every active member has accumulated `accumulationSteps` gradients;
 * - `adaptive`: the fastest active member leads the slowest by at least `adaptiveThreshold`
 *   steps (the config's "leads by"), or has done `adaptiveMaxSteps` steps when that is set;
 * - `async`: never.
 * A member that has not reported yet counts as 0 steps; a group with no active member never syncs.
 */
export function shouldSync(p: SyncProgress): boolean {
  const active = activeMembers(p);
  if (active.length === 0) return false;
  const progress = active.map((m) => p.stepsSinceSync[m] ?? 0);
  const slowest = Math.min(...progress);
  const fastest = Math.max(...progress);
  const { policy } = p;
  switch (policy.syncMode) {
    case 'sync':
      return policy.syncSteps !== null && slowest >= policy.syncSteps;
    case 'accumulation':
      return policy.accumulationSteps !== null && slowest >= policy.accumulationSteps;
    case 'adaptive':
      return (policy.adaptiveThreshold !== null && fastest - slowest >= policy.adaptiveThreshold)
        || (policy.adaptiveMaxSteps !== null && fastest >= policy.adaptiveMaxSteps);
    case 'async':
      return false;
  }
}

/** `running.sync` for the barrier-based modes, `running.async` for `async`. */
export function usesSyncRounds(policy: SyncPolicy): boolean {
  return policy.syncMode !== 'async';
}
