/**
 * One worker group's lifecycle as an XState v5 machine. Plain data in, plain
 * data out: the machine decides *when* (a sync round is due, members must be
 * resynced, members are dropped) and emits that; the group actor does the I/O
 * (reduce-scatter, pulls, messages) and reports back with `groupEvents.*`.
 *
 * Time only matters for the two timeouts (`forming`, `degraded`); they are
 * XState `after` delays read from the context, so an actor created with a
 * simulated clock (`toXStateClock(new SimulatedClock())`) tests them without
 * sleeping.
 *
 * Step counting: `step.completed` carries the member's own step counter.
 * The machine keeps the last counter per member (`lastStep`, to ignore repeats
 * and reordering) and the steps each member did since the group's last common
 * point (`stepsSinceSync`), which is reset when running starts, when a sync
 * round starts and when a resync completes. Steps are recorded in every state,
 * so a member that kept training while the group was degraded does not look
 * far ahead afterwards.
 *
 * Readiness: a round also starts once every active member reported
 * `member.ready` for it (its window is closed and its slices are out: a
 * member that ran out of batches is ready with fewer steps), or when any
 * member sent `sync.requested` for it (adaptive). Both are kept by round
 * number (`readyFor`, `requestedRound`), so a report that arrives early —
 * a fast member's next window while this replica still reduces — counts
 * for the right round.
 */
import { and, createActor, emit, assign, setup, type Actor, type InspectionEvent, type SnapshotFrom } from 'xstate';
import { ValidationError, type Clock, type Timer } from '../../runtime/mod.ts';
import type { GroupEmitted, GroupEvent } from './group.events.ts';
import { activeMembers, shouldSync, usesSyncRounds, validateSyncPolicy, type SyncPolicy } from './sync-policy.ts';

/**
 * The group's lifecycle states, as `groupStateOf` names them:
 * - `forming`: waiting for the expected members to join; after the forming timeout it runs with those who joined (none: keeps waiting).
 * - `running.sync.stepping`: members take local steps; a round starts as soon as `shouldSync` holds.
 * - `running.sync.reducing`: round `startedRound` is in flight (`sync.due` emitted); waits for its `sync.completed`.
 * - `running.async`: members push to the servers on their own; no rounds.
 * - `degraded`: some members are lost or partitioned away. Silent ones (`member.lost`, `group.partitioned`): no rounds; waits for them to
 *   rejoin, or for the recovery timeout to go on without them. Dead by the health actor's verdict (`member.dead`, kept in `cut`): the
 *   group is async — a round already under way among the others is finished (`degraded.reducing`), and every window that starts
 *   here is pushed by its member alone — until the driver re-forms the group (it comes back, or the driver's recovery timeout).
 * - `resyncing`: bringing every active member to one parameter version (`resync.due` emitted); waits for `resync.completed`.
 * - `regrouping`: the scheduler is recomputing groups; waits for `regroup.completed` (new membership, or none: dissolved).
 * - `stopped`: final; reached by `group.stop` from anywhere, or when a regroup dissolves the group.
 */
export type GroupState =
  | 'forming'
  | 'running.sync.stepping'
  | 'running.sync.reducing'
  | 'running.async'
  | 'degraded'
  | 'resyncing'
  | 'regrouping'
  | 'stopped';

export const GROUP_STATES = [
  'forming', 'running.sync.stepping', 'running.sync.reducing', 'running.async', 'degraded', 'resyncing', 'regrouping', 'stopped',
] as const satisfies readonly GroupState[];

export interface GroupMachineInput {
  /** The group's name (for emitted events and output). */
  group: string;
  /** Members expected to join; at least one, no duplicates. */
  members: readonly string[];
  policy: SyncPolicy;
  /** How long `forming` waits for every member before running with those present. */
  formingTimeoutMs: number;
  /** How long `degraded` waits for lost members before resyncing without them. */
  recoveryTimeoutMs: number;
}

export interface GroupContext {
  group: string;
  policy: SyncPolicy;
  formingTimeoutMs: number;
  recoveryTimeoutMs: number;
  /** Current membership, sorted. In `forming`, the members expected. */
  members: string[];
  /** `forming`: the members that joined so far; afterwards equal to `members`. */
  joined: string[];
  /** Members lost or partitioned away (non-empty only in `degraded`). */
  lost: string[];
  /**
   * The lost members that are dead by the health actor's verdict. While there
   * is one the group is async (`degraded`, members push on their own) and
   * stays so until a regroup re-forms it: windows taken alone leave the
   * members' window counters apart, so only a re-form brings them back to
   * one round again.
   */
  cut: string[];
  /** Last step counter each member reported; kept across regroups, so a returning member's old reports stay repeats. */
  lastStep: Record<string, number>;
  /** Steps each member did since the last common point (see the file comment). */
  stepsSinceSync: Record<string, number>;
  /** Highest round each member reported ready for (`member.ready`). */
  readyFor: Record<string, number>;
  /** Highest round some member requested (`sync.requested`). */
  requestedRound: number;
  /** Number of the last round started; a round abandoned by a partition is never reused. */
  startedRound: number;
  /** Number of the last round that completed. */
  completedRound: number;
  /** Parameter version the group is at (from `sync.completed` / `resync.completed`). */
  version: number;
  regroupReason: string | null;
  stopReason: string | null;
}

export interface GroupOutput {
  group: string;
  /** The `group.stop` reason, or `dissolved` when a regroup left the group empty. */
  reason: string;
  version: number;
  completedRound: number;
}

// ------------------------------------------------------------ pure helpers

const sorted = (xs: Iterable<string>): string[] => [...new Set(xs)].sort();
const without = (xs: readonly string[], drop: readonly string[]): string[] => xs.filter((x) => !drop.includes(x));
/** Keys sorted so equal contexts serialize equally (the model-based tests rely on it). */
function record(entries: Iterable<[string, number]>): Record<string, number> {
  return Object.fromEntries([...entries].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}
const zeroSteps = (members: readonly string[]): Record<string, number> => record(members.map((m) => [m, 0]));

function initialContext(input: GroupMachineInput): GroupContext {
  const where = `group ${JSON.stringify(input.group)}`;
  if (input.members.length === 0) throw new ValidationError(`${where}: needs at least one member`, { data: { group: input.group } });
  if (new Set(input.members).size !== input.members.length) {
    throw new ValidationError(`${where}: duplicate members in ${JSON.stringify(input.members)}`, { data: { group: input.group } });
  }
  for (const key of ['formingTimeoutMs', 'recoveryTimeoutMs'] as const) {
    if (!(Number.isFinite(input[key]) && input[key] > 0)) throw new ValidationError(`${where}: ${key} must be > 0, got ${input[key]}`, { data: { group: input.group } });
  }
  return {
    group: input.group,
    policy: { ...validateSyncPolicy(input.policy, where) },
    formingTimeoutMs: input.formingTimeoutMs,
    recoveryTimeoutMs: input.recoveryTimeoutMs,
    members: sorted(input.members),
    joined: [],
    lost: [],
    cut: [],
    lastStep: {},
    stepsSinceSync: {},
    readyFor: {},
    requestedRound: 0,
    startedRound: 0,
    completedRound: 0,
    version: 0,
    regroupReason: null,
    stopReason: null,
  };
}

/** Every active member is ready for the next round, or some member requested it. */
function roundReady(context: GroupContext): boolean {
  const next = context.startedRound + 1;
  if (context.requestedRound >= next) return activeMembers(context).length > 0;
  const active = activeMembers(context);
  return active.length > 0 && active.every((m) => (context.readyFor[m] ?? 0) >= next);
}

/** Members of a partition event that are still active here. */
const activeAmong = (context: GroupContext, members: readonly string[]): string[] =>
  activeMembers(context).filter((m) => members.includes(m));

// ------------------------------------------------------------ machine

const groupSetup = setup({
  types: {} as {
    context: GroupContext;
    events: GroupEvent;
    emitted: GroupEmitted;
    output: GroupOutput;
  },
  delays: {
    formingTimeout: ({ context }) => context.formingTimeoutMs,
    recoveryTimeout: ({ context }) => context.recoveryTimeoutMs,
  },
  guards: {
    /** The context's policy runs sync rounds (sync, adaptive, accumulation). */
    syncRoundsMode: ({ context }) => usesSyncRounds(context.policy),
    allJoined: ({ context }) => context.members.every((m) => context.joined.includes(m)),
    someJoined: ({ context }) => context.joined.length > 0,
    syncDue: ({ context }) => shouldSync(context) || roundReady(context),
    /** degraded by a dead member: the round of a window every other member began in sync (their slices are out) still runs. */
    cutRoundReady: ({ context }) => context.cut.length > 0 && roundReady(context),
    /** The recovery timeout applies to silent members only; a dead one waits for the driver's re-form. */
    noCut: ({ context }) => context.cut.length === 0,
    hasCut: ({ context }) => context.cut.length > 0,
    /** forming: a dead expected member is not waited for (the others still form). */
    isDeadExpected: ({ context, event }) => event.type === 'member.dead' && context.members.includes(event.member) && context.members.some((m) => m !== event.member),
    isExpectedNotJoined: ({ context, event }) =>
      (event.type === 'member.joined' || event.type === 'member.rejoined') && context.members.includes(event.member) && !context.joined.includes(event.member),
    isJoined: ({ context, event }) => (event.type === 'member.lost' || event.type === 'member.dead') && context.joined.includes(event.member),
    partitionHitsJoined: ({ context, event }) => event.type === 'group.partitioned' && event.members.some((m) => context.joined.includes(m)),
    isMember: ({ context, event }) =>
      (event.type === 'step.completed' || event.type === 'member.ready' || event.type === 'sync.requested') && context.members.includes(event.member),
    isActiveMember: ({ context, event }) => event.type === 'member.lost' && activeMembers(context).includes(event.member),
    isDeadMember: ({ context, event }) => event.type === 'member.dead' && context.members.includes(event.member) && context.members.some((m) => m !== event.member && !context.lost.includes(m)),
    partitionHitsActive: ({ context, event }) => event.type === 'group.partitioned' && activeAmong(context, event.members).length > 0,
    completesRound: ({ context, event }) => event.type === 'sync.completed' && event.round === context.startedRound,
    isLost: ({ context, event }) => event.type === 'member.rejoined' && context.lost.includes(event.member) && !context.cut.includes(event.member),
    isLastLost: ({ context, event }) => event.type === 'member.rejoined' && context.lost.length === 1 && context.lost[0] === event.member && context.cut.length === 0,
    someActive: ({ context }) => activeMembers(context).length > 0,
    dissolves: ({ event }) => event.type === 'regroup.completed' && event.members.length === 0,
  },
  actions: {
    markJoined: assign({
      joined: ({ context, event }) => (event.type === 'member.joined' || event.type === 'member.rejoined' ? sorted([...context.joined, event.member]) : context.joined),
    }),
    unmarkJoined: assign({
      joined: ({ context, event }) =>
        event.type === 'member.lost' || event.type === 'member.dead' ? without(context.joined, [event.member])
        : event.type === 'group.partitioned' ? without(context.joined, event.members)
        : context.joined,
    }),
    /** Forming timeout: the members that did not join leave the membership. */
    emitUnjoinedDropped: emit(({ context }) => ({ type: 'members.dropped' as const, group: context.group, members: without(context.members, context.joined), reason: 'forming-timeout' as const })),
    dropUnjoined: assign({ members: ({ context }) => [...context.joined] }),
    emitFormingStalled: emit(({ context }) => ({ type: 'forming.stalled' as const, group: context.group, expected: [...context.members] })),
    startRunning: assign({
      joined: ({ context }) => [...context.members],
      lost: [],
      stepsSinceSync: ({ context }) => zeroSteps(context.members),
    }),
    recordStep: assign(({ context, event }) => {
      if (event.type !== 'step.completed') return {};
      const last = context.lastStep[event.member];
      if (last !== undefined && event.step <= last) return {}; // a repeat or a late, reordered report
      const advanced = last === undefined ? 1 : event.step - last;
      return {
        lastStep: record([...Object.entries(context.lastStep).filter(([m]) => m !== event.member), [event.member, event.step]]),
        stepsSinceSync: record([
          ...Object.entries(context.stepsSinceSync).filter(([m]) => m !== event.member),
          [event.member, (context.stepsSinceSync[event.member] ?? 0) + advanced],
        ]),
      };
    }),
    recordReady: assign({
      readyFor: ({ context, event }) => (event.type === 'member.ready' && event.round > (context.readyFor[event.member] ?? 0)
        ? record([...Object.entries(context.readyFor).filter(([m]) => m !== event.member), [event.member, event.round]])
        : context.readyFor),
    }),
    recordRequested: assign({
      requestedRound: ({ context, event }) => (event.type === 'sync.requested' ? Math.max(context.requestedRound, event.round) : context.requestedRound),
    }),
    startRound: assign({
      startedRound: ({ context }) => context.startedRound + 1,
      stepsSinceSync: ({ context }) => zeroSteps(context.members),
    }),
    emitSyncDue: emit(({ context }) => ({
      type: 'sync.due' as const, group: context.group, round: context.startedRound, members: activeMembers(context), version: context.version,
    })),
    // Rounds only move the version forward; a resync may set any version (e.g. a checkpoint it rolled back to).
    completeRound: assign(({ context, event }) => (event.type === 'sync.completed'
      ? { completedRound: event.round, version: Math.max(context.version, event.version) }
      : {})),
    markLost: assign({
      lost: ({ context, event }) =>
        event.type === 'member.lost' ? sorted([...context.lost, event.member])
        : event.type === 'member.dead' ? (context.lost.includes(event.member) ? context.lost : sorted([...context.lost, event.member]))
        : event.type === 'group.partitioned' ? sorted([...context.lost, ...activeAmong(context, event.members)])
        : context.lost,
    }),
    markCut: assign({
      cut: ({ context, event }) => (event.type === 'member.dead' && !context.cut.includes(event.member) ? sorted([...context.cut, event.member]) : context.cut),
    }),
    /** forming: a member dead by the verdicts leaves the expected membership at once. */
    emitExpectedDeadDropped: emit(({ event, context }) => ({
      type: 'members.dropped' as const, group: context.group, members: event.type === 'member.dead' ? [event.member] : [], reason: 'dead' as const,
    })),
    dropExpectedDead: assign(({ context, event }) => (event.type === 'member.dead'
      ? { members: without(context.members, [event.member]), joined: without(context.joined, [event.member]) }
      : {})),
    markRejoined: assign({
      lost: ({ context, event }) => (event.type === 'member.rejoined' ? without(context.lost, [event.member]) : context.lost),
    }),
    /** Recovery timeout: the lost members leave the membership. */
    emitLostDropped: emit(({ context }) => ({ type: 'members.dropped' as const, group: context.group, members: [...context.lost], reason: 'recovery-timeout' as const })),
    dropLost: assign(({ context }) => ({
      members: without(context.members, context.lost),
      joined: without(context.joined, context.lost),
      lost: [],
      cut: [],
    })),
    emitResyncDue: emit(({ context }) => ({ type: 'resync.due' as const, group: context.group, version: context.version, members: activeMembers(context) })),
    completeResync: assign(({ context, event }) => (event.type === 'resync.completed'
      ? { version: event.version, stepsSinceSync: zeroSteps(context.members) }
      : {})),
    recordRegroupReason: assign({ regroupReason: ({ event }) => (event.type === 'group.regroup' ? event.reason : null) }),
    applyNewMembership: assign(({ event }) => {
      if (event.type !== 'regroup.completed') return {};
      const members = sorted(event.members);
      return {
        members,
        joined: [],
        lost: [],
        cut: [],
        policy: { ...event.policy },
        stepsSinceSync: {},
        readyFor: {},
        regroupReason: null,
      };
    }),
    recordDissolved: assign({ members: [], joined: [], lost: [], cut: [], stopReason: 'dissolved' }),
    recordStopReason: assign({ stopReason: ({ event }) => (event.type === 'group.stop' ? event.reason : null) }),
  },
});

const regroupTransition = { target: 'regrouping', actions: 'recordRegroupReason' } as const;

function buildGroupMachine(context: GroupContext) {
  return groupSetup.createMachine({
    id: 'group',
    context: () => structuredClone(context),
    initial: 'forming',
    on: {
      'group.stop': { target: '.stopped', actions: 'recordStopReason' },
      'step.completed': { guard: 'isMember', actions: 'recordStep' },
      'member.ready': { guard: 'isMember', actions: 'recordReady' },
      'sync.requested': { guard: 'isMember', actions: 'recordRequested' },
    },
    states: {
      forming: {
        always: [
          { guard: and(['allJoined', 'syncRoundsMode']), target: 'running.sync', actions: 'startRunning' },
          { guard: 'allJoined', target: 'running.async', actions: 'startRunning' },
        ],
        after: {
          formingTimeout: [
            { guard: and(['someJoined', 'syncRoundsMode']), target: 'running.sync', actions: ['emitUnjoinedDropped', 'dropUnjoined', 'startRunning'] },
            { guard: 'someJoined', target: 'running.async', actions: ['emitUnjoinedDropped', 'dropUnjoined', 'startRunning'] },
            // Nobody yet: keep waiting, with a fresh timeout, and say so.
            { target: 'forming', reenter: true, actions: 'emitFormingStalled' },
          ],
        },
        on: {
          'member.joined': { guard: 'isExpectedNotJoined', actions: 'markJoined' },
          'member.rejoined': { guard: 'isExpectedNotJoined', actions: 'markJoined' },
          'member.lost': { guard: 'isJoined', actions: 'unmarkJoined' },
          'member.dead': { guard: 'isDeadExpected', actions: ['emitExpectedDeadDropped', 'dropExpectedDead'] },
          'group.partitioned': { guard: 'partitionHitsJoined', actions: 'unmarkJoined' },
          'group.regroup': regroupTransition,
        },
      },
      running: {
        initial: 'sync',
        on: {
          'member.dead': { guard: 'isDeadMember', target: 'degraded', actions: ['markLost', 'markCut'] },
          'member.lost': { guard: 'isActiveMember', target: 'degraded', actions: 'markLost' },
          'group.partitioned': { guard: 'partitionHitsActive', target: 'degraded', actions: 'markLost' },
          'group.regroup': regroupTransition,
        },
        states: {
          sync: {
            initial: 'stepping',
            states: {
              stepping: {
                always: { guard: 'syncDue', target: 'reducing' },
              },
              reducing: {
                entry: ['startRound', 'emitSyncDue'],
                on: {
                  'sync.completed': { guard: 'completesRound', target: 'stepping', actions: 'completeRound' },
                },
              },
            },
          },
          async: {},
        },
      },
      degraded: {
        initial: 'stepping',
        // Counted from the first loss; later losses do not extend it. Only silent members are dropped by it.
        after: {
          recoveryTimeout: [
            { guard: and(['noCut', 'someActive']), target: 'resyncing', actions: ['emitLostDropped', 'dropLost'] },
            // Everyone is gone: wait another period rather than drop the whole group.
            { guard: 'noCut', target: 'degraded', reenter: true },
          ],
        },
        on: {
          'member.rejoined': [
            { guard: 'isLastLost', target: 'resyncing', actions: 'markRejoined' },
            { guard: 'isLost', actions: 'markRejoined' },
          ],
          'member.lost': { guard: 'isActiveMember', actions: 'markLost' },
          'member.dead': { guard: 'isDeadMember', actions: ['markLost', 'markCut'] },
          'group.partitioned': { guard: 'partitionHitsActive', actions: 'markLost' },
          // A round under way when the verdict came (or started here since) finishes among the others.
          'sync.completed': { guard: and(['completesRound', 'hasCut']), target: '.stepping', actions: 'completeRound' },
          'group.regroup': regroupTransition,
        },
        states: {
          stepping: {
            always: { guard: 'cutRoundReady', target: 'reducing' },
          },
          reducing: {
            entry: ['startRound', 'emitSyncDue'],
          },
        },
      },
      resyncing: {
        entry: 'emitResyncDue',
        on: {
          'resync.completed': [
            { guard: 'syncRoundsMode', target: 'running.sync', actions: 'completeResync' },
            { target: 'running.async', actions: 'completeResync' },
          ],
          'member.lost': { guard: 'isActiveMember', target: 'degraded', actions: 'markLost' },
          'member.dead': { guard: 'isDeadMember', target: 'degraded', actions: ['markLost', 'markCut'] },
          'group.partitioned': { guard: 'partitionHitsActive', target: 'degraded', actions: 'markLost' },
          'group.regroup': regroupTransition,
        },
      },
      regrouping: {
        on: {
          'regroup.completed': [
            { guard: 'dissolves', target: 'stopped', actions: 'recordDissolved' },
            { target: 'forming', actions: 'applyNewMembership' },
          ],
        },
      },
      stopped: { type: 'final' },
    },
    output: ({ context }) => ({
      group: context.group,
      reason: context.stopReason ?? 'stopped',
      version: context.version,
      completedRound: context.completedRound,
    }),
  });
}

/** The machine for one group, its initial context built (and checked) from `input`. Throws ValidationError on bad input. */
export function createGroupMachine(input: GroupMachineInput) {
  return buildGroupMachine(initialContext(input));
}

export type GroupMachine = ReturnType<typeof createGroupMachine>;
export type GroupSnapshot = SnapshotFrom<GroupMachine>;
export type GroupActor = Actor<GroupMachine>;

/** The `GroupState` a snapshot is in. */
export function groupStateOf(snapshot: Pick<GroupSnapshot, 'value'>): GroupState {
  const path: string[] = [];
  let value: unknown = snapshot.value;
  while (typeof value === 'object' && value !== null) {
    const [key, child] = Object.entries(value)[0] ?? [];
    if (key === undefined) break;
    path.push(key);
    value = child;
  }
  if (typeof value === 'string') path.push(value);
  // degraded's inner steps (a round finishing among the others) are one state to the outside.
  const state = path[0] === 'degraded' ? 'degraded' : path.join('.');
  if (!(GROUP_STATES as readonly string[]).includes(state)) throw new Error(`not a group state: ${state}`);
  return state as GroupState;
}

/** XState's clock interface, backed by our `Clock` (so `SimulatedClock.increment` fires `after` delays). */
export function toXStateClock(clock: Clock): { setTimeout(fn: (...args: unknown[]) => void, ms: number): Timer; clearTimeout(timer: Timer): void } {
  return {
    setTimeout: (fn, ms) => clock.setTimeout(fn, ms),
    clearTimeout: (timer) => timer.cancel(),
  };
}

/**
 * A group actor, not started: subscribe to emitted events first
 * (`actor.on('sync.due', ...)`), then `start()`.
 */
export function createGroupActor(input: GroupMachineInput, options: { clock: Clock; inspect?: (event: InspectionEvent) => void }): GroupActor {
  return createActor(createGroupMachine(input), {
    clock: toXStateClock(options.clock),
    ...(options.inspect ? { inspect: options.inspect } : {}),
  });
}
