/**
 * Events the group machine takes (`GroupEvent`, made by `groupEvents.*`) and
 * events it emits for its actor to act on (`GroupEmitted`, via `actor.on`).
 * Plain data only: every field is JSON/msgpack-safe, absence is `null`.
 */
import { ValidationError } from '../../runtime/mod.ts';
import { validateSyncPolicy, type SyncPolicy } from './sync-policy.ts';

/** A member announced itself to the group (forming). */
export interface MemberJoinedEvent { type: 'member.joined'; member: string }
/** Health lost a member's heartbeat. */
export interface MemberLostEvent { type: 'member.lost'; member: string }
/** The health actor's verdict: `member` is dead (its process is gone). It leaves the group at once, without the recovery wait. */
export interface MemberDeadEvent { type: 'member.dead'; member: string }
/** A lost member's heartbeats are back. */
export interface MemberRejoinedEvent { type: 'member.rejoined'; member: string }
/** Health saw a partition: these members are on the other side. */
export interface GroupPartitionedEvent { type: 'group.partitioned'; members: string[] }
/** A member finished its local step number `step` (its own counter, increasing). */
export interface StepCompletedEvent { type: 'step.completed'; member: string; step: number }
/** A member closed its window for round `round` and sent its gradient slices (`sync` / `accumulation`: a round starts once every active member is ready). */
export interface MemberReadyEvent { type: 'member.ready'; member: string; round: number }
/** A member asks round `round` to start now (`adaptive`: it saw the progress gap, hit its step cap, or ran out of batches). */
export interface SyncRequestedEvent { type: 'sync.requested'; member: string; round: number }
/** The reduction of sync round `round` finished; the group is at parameter `version`. */
export interface SyncCompletedEvent { type: 'sync.completed'; round: number; version: number }
/** Every active member now holds parameter `version`. */
export interface ResyncCompletedEvent { type: 'resync.completed'; version: number }
/** The scheduler is recomputing groups. */
export interface GroupRegroupEvent { type: 'group.regroup'; reason: string }
/** The scheduler's new membership for this group; no members: the group is dissolved. */
export interface RegroupCompletedEvent { type: 'regroup.completed'; members: string[]; policy: SyncPolicy }
/** Stop the group, from any state. */
export interface GroupStopEvent { type: 'group.stop'; reason: string }

export type GroupEvent =
  | MemberJoinedEvent
  | MemberLostEvent
  | MemberDeadEvent
  | MemberRejoinedEvent
  | GroupPartitionedEvent
  | StepCompletedEvent
  | MemberReadyEvent
  | SyncRequestedEvent
  | SyncCompletedEvent
  | ResyncCompletedEvent
  | GroupRegroupEvent
  | RegroupCompletedEvent
  | GroupStopEvent;

export type GroupEventType = GroupEvent['type'];

/** Makes every `GroupEvent`; `regroupCompleted` checks the policy and membership. */
export const groupEvents = {
  memberJoined: (member: string): MemberJoinedEvent => ({ type: 'member.joined', member }),
  memberLost: (member: string): MemberLostEvent => ({ type: 'member.lost', member }),
  memberDead: (member: string): MemberDeadEvent => ({ type: 'member.dead', member }),
  memberRejoined: (member: string): MemberRejoinedEvent => ({ type: 'member.rejoined', member }),
  partitioned: (members: readonly string[]): GroupPartitionedEvent => ({ type: 'group.partitioned', members: [...members] }),
  stepCompleted: (member: string, step: number): StepCompletedEvent => ({ type: 'step.completed', member, step }),
  memberReady: (member: string, round: number): MemberReadyEvent => ({ type: 'member.ready', member, round }),
  syncRequested: (member: string, round: number): SyncRequestedEvent => ({ type: 'sync.requested', member, round }),
  syncCompleted: (round: number, version: number): SyncCompletedEvent => ({ type: 'sync.completed', round, version }),
  resyncCompleted: (version: number): ResyncCompletedEvent => ({ type: 'resync.completed', version }),
  regroup: (reason: string): GroupRegroupEvent => ({ type: 'group.regroup', reason }),
  regroupCompleted: (members: readonly string[], policy: SyncPolicy): RegroupCompletedEvent => {
    if (new Set(members).size !== members.length) {
      throw new ValidationError(`regroup.completed: duplicate members in ${JSON.stringify(members)}`, { data: { members: [...members] } });
    }
    return { type: 'regroup.completed', members: [...members], policy: { ...validateSyncPolicy(policy, 'regroup.completed') } };
  },
  stop: (reason: string): GroupStopEvent => ({ type: 'group.stop', reason }),
};

// ------------------------------------------------------------ emitted events

/** Start sync round `round` now (intra-group reduce) among `members`; answer with `sync.completed`. */
export interface SyncDueEmitted { type: 'sync.due'; group: string; round: number; members: string[]; version: number }
/** Bring `members` to one parameter version (at least `version`); answer with `resync.completed`. */
export interface ResyncDueEmitted { type: 'resync.due'; group: string; version: number; members: string[] }
/** These members left the membership: they never joined in time, or never came back. */
export interface MembersDroppedEmitted { type: 'members.dropped'; group: string; members: string[]; reason: 'forming-timeout' | 'recovery-timeout' | 'dead' }
/** The forming timeout passed with nobody joined; the group keeps waiting (and re-arms the timeout). */
export interface FormingStalledEmitted { type: 'forming.stalled'; group: string; expected: string[] }

export type GroupEmitted = SyncDueEmitted | ResyncDueEmitted | MembersDroppedEmitted | FormingStalledEmitted;
