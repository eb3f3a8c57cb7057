import { test } from 'node:test';
import assert from 'node:assert/strict';
import { getAdjacencyMap, getShortestPaths, getStateNodes } from '@xstate/graph';
import {
  __unsafe_getAllOwnEventDescriptors, createActor,
  type AnyMachineSnapshot, type AnyStateMachine, type AnyTransitionDefinition, type EventObject, type InspectionEvent,
} from 'xstate';
import { SimulatedClock, ValidationError } from '../../runtime/mod.ts';
import {
  GROUP_STATES, createGroupActor, createGroupMachine, groupStateOf, toXStateClock,
  type GroupActor, type GroupMachine, type GroupMachineInput, type GroupSnapshot, type GroupState,
} from '../../actors/group/group.machine.ts';
import { groupEvents as ev, type GroupEmitted, type GroupEvent, type GroupEventType } from '../../actors/group/group.events.ts';
import { shouldSync, syncPolicyFromConfig, type SyncPolicy } from '../../actors/group/sync-policy.ts';

// ------------------------------------------------------------ helpers

function policy(syncMode: SyncPolicy['syncMode'], n: number | null = null, adaptiveMaxSteps: number | null = null): SyncPolicy {
  return {
    syncMode,
    syncSteps: syncMode === 'sync' ? n : null,
    accumulationSteps: syncMode === 'accumulation' ? n : null,
    adaptiveThreshold: syncMode === 'adaptive' ? n : null,
    adaptiveMaxSteps,
  };
}

const FORMING_MS = 1_000;
const RECOVERY_MS = 5_000;

function input(over: Partial<GroupMachineInput> = {}): GroupMachineInput {
  return { group: 'g', members: ['a', 'b'], policy: policy('sync', 1), formingTimeoutMs: FORMING_MS, recoveryTimeoutMs: RECOVERY_MS, ...over };
}

/** A started actor on a simulated clock, recording what it emits. */
function start(over: Partial<GroupMachineInput> = {}) {
  const clock = new SimulatedClock();
  const actor = createGroupActor(input(over), { clock });
  const emitted: GroupEmitted[] = [];
  actor.on('*', (e) => { emitted.push(e); });
  actor.start();
  const state = () => groupStateOf(actor.getSnapshot());
  const ctx = () => actor.getSnapshot().context;
  const send = (...events: GroupEvent[]) => { for (const e of events) actor.send(e); };
  return { clock, actor, emitted, state, ctx, send };
}

/** Formed and running: every member joined. */
function running(over: Partial<GroupMachineInput> = {}) {
  const g = start(over);
  for (const m of input(over).members) g.send(ev.memberJoined(m));
  return g;
}

const ofType = <T extends GroupEmitted['type']>(emitted: GroupEmitted[], type: T) =>
  emitted.filter((e): e is Extract<GroupEmitted, { type: T }> => e.type === type);

const serialize = (s: Pick<GroupSnapshot, 'value' | 'context'>) => JSON.stringify({ value: s.value, context: s.context });

// ------------------------------------------------------------ the model

/** Sample events for the graph walk: each kind, members in and out of the group, right and wrong rounds. */
const MODEL_POLICY = policy('sync', 1);
const SAMPLE_EVENTS: GroupEvent[] = [
  ev.memberJoined('a'), ev.memberJoined('b'), ev.memberJoined('x'),
  ev.memberRejoined('a'), ev.memberRejoined('b'),
  ev.memberLost('a'), ev.memberLost('b'),
  ev.memberDead('a'), ev.memberDead('b'),
  ev.partitioned(['b']), ev.partitioned(['a', 'b']),
  ev.stepCompleted('a', 1), ev.stepCompleted('b', 1),
  ev.memberReady('a', 1), ev.syncRequested('b', 1),
  ev.syncCompleted(1, 1), ev.syncCompleted(2, 2),
  ev.resyncCompleted(3),
  ev.regroup('rebalance'),
  ev.regroupCompleted(['a', 'b'], MODEL_POLICY), ev.regroupCompleted(['a', 'b'], policy('async')), ev.regroupCompleted(['a'], MODEL_POLICY),
  ev.regroupCompleted([], MODEL_POLICY),
  ev.stop('done'),
];

type ModelEvent = GroupEvent | { type: `xstate.after.${string}` };
const isAfter = (e: EventObject): boolean => e.type.startsWith('xstate.after.');

/** Every sample in every state (so ignored events are walked too), plus the timeouts armed in this state. Nothing after `stopped`. */
function modelEvents(snapshot: GroupSnapshot): ModelEvent[] {
  if (snapshot.status === 'done') return [];
  const timeouts = __unsafe_getAllOwnEventDescriptors(snapshot).filter((t) => t.startsWith('xstate.after.')).map((type) => ({ type }) as ModelEvent);
  return [...SAMPLE_EVENTS, ...timeouts];
}

const modelMachine = createGroupMachine(input({ policy: MODEL_POLICY }));
// @xstate/graph's types carry neither emitted events nor extra (timeout) event objects: view the machine loosely for the walk.
const graphLogic = modelMachine as unknown as AnyStateMachine;
type ModelPath = { state: GroupSnapshot; steps: Array<{ state: GroupSnapshot; event: ModelEvent }> };
type Adjacency = Record<string, { state: GroupSnapshot; transitions: Record<string, { event: ModelEvent; state: GroupSnapshot }> }>;
const traversal = { events: modelEvents as unknown as (s: AnyMachineSnapshot) => EventObject[] };
const adjacency = getAdjacencyMap(graphLogic, traversal) as unknown as Adjacency;
const shortestPaths = getShortestPaths(graphLogic, traversal) as unknown as ModelPath[];
const shortestPathTo = (target: GroupState) =>
  (getShortestPaths(graphLogic, { ...traversal, toState: (s) => groupStateOf(s as GroupSnapshot) === target }) as unknown as ModelPath[])[0];

/** Every transition the machine defines, including guarded alternatives, `after` and `always` ones. */
function definedTransitions(machine: GroupMachine): Map<AnyTransitionDefinition, string> {
  const out = new Map<AnyTransitionDefinition, string>();
  for (const node of [machine.root, ...getStateNodes(machine.root)]) {
    for (const [eventType, defs] of node.transitions) defs.forEach((t, i) => out.set(t, `${node.id} --${eventType}[${i}]-->`));
    (node.always ?? []).forEach((t, i) => out.set(t, `${node.id} --always[${i}]-->`));
  }
  return out;
}

const recordTransitions = (taken: Set<AnyTransitionDefinition>) => (e: InspectionEvent) => {
  if (e.type === '@xstate.microstep') for (const t of e._transitions) taken.add(t);
};

/** Plays `events` on a real actor; timeouts are driven by moving the simulated clock, never by sending them. */
function replay(machine: GroupMachine, events: readonly ModelEvent[], taken: Set<AnyTransitionDefinition>, onStep: (i: number, actor: GroupActor) => void) {
  const clock = new SimulatedClock();
  const actor = createActor(machine, { clock: toXStateClock(clock), inspect: recordTransitions(taken) }).start();
  events.forEach((event, i) => {
    if (isAfter(event)) {
      const { context } = actor.getSnapshot();
      clock.increment(event.type.includes('.formingTimeout.') ? context.formingTimeoutMs : context.recoveryTimeoutMs);
    } else {
      actor.send(event as GroupEvent);
    }
    onStep(i, actor);
  });
  return actor;
}

const pathTaken = new Set<AnyTransitionDefinition>();

test('model: every shortest path replays on a real actor (timeouts by the simulated clock) through the same snapshots', () => {
  assert.equal(shortestPaths.length, Object.keys(adjacency).length, 'one shortest path per reachable snapshot');
  for (const path of shortestPaths) {
    // steps[0] is the initial snapshot (event xstate.init); steps[i] is the snapshot after steps[i].event.
    const events = path.steps.slice(1).map((s) => s.event);
    const actor = replay(modelMachine, events, pathTaken, (i, a) => {
      assert.equal(serialize(a.getSnapshot()), serialize(path.steps[i + 1]!.state), `step ${i + 1} of ${events.map((e) => e.type).join(' → ')}`);
    });
    assert.equal(serialize(actor.getSnapshot()), serialize(path.state));
    actor.stop();
  }
});

test('model: every state and every defined transition is exercised by the generated paths', () => {
  // The paths are "shortest path to each snapshot" plus "that path and one more event" for
  // every edge of the graph. The first kind were replayed in full above; for the second, the
  // path's end snapshot is restored into an actor and the last event sent, timeouts included.
  const edgeTaken = new Set<AnyTransitionDefinition>();
  let edges = 0;
  for (const { state: from, transitions } of Object.values(adjacency)) {
    for (const { event, state: to } of Object.values(transitions)) {
      edges++;
      const actor = createActor(modelMachine, { snapshot: from, clock: toXStateClock(new SimulatedClock()), inspect: recordTransitions(edgeTaken) }).start();
      actor.send(event as GroupEvent);
      assert.equal(serialize(actor.getSnapshot()), serialize(to), `${groupStateOf(from)} + ${event.type}`);
      actor.stop();
    }
  }
  const defined = definedTransitions(modelMachine);
  const covered = new Set([...pathTaken, ...edgeTaken].filter((t) => defined.has(t)));
  const missing = [...defined].filter(([t]) => !covered.has(t)).map(([, label]) => label);
  assert.deepEqual(missing, [], 'transitions never taken');

  const statesSeen = new Set(Object.values(adjacency).map(({ state }) => groupStateOf(state)));
  assert.deepEqual([...statesSeen].sort(), [...GROUP_STATES].sort());
  const atomicNodes = getStateNodes(modelMachine.root).filter((n) => n.type === 'atomic' || n.type === 'final');
  // degraded's two inner steps (a round finishing among the others while a member is dead) are one GroupState.
  assert.deepEqual(atomicNodes.map((n) => n.id).filter((id) => id.startsWith('group.degraded.')).sort(), ['group.degraded.reducing', 'group.degraded.stepping']);
  assert.equal(atomicNodes.length, GROUP_STATES.length + 1, 'GroupState names every leaf state');

  // Printed so the coverage numbers are visible in test output.
  console.log(`group machine model: ${Object.keys(adjacency).length} snapshots, ${edges} edges, ${shortestPaths.length} shortest paths; `
    + `states ${statesSeen.size}/${GROUP_STATES.length}, transitions ${covered.size}/${defined.size}`);
});

/** Per state, event types that must leave the snapshot exactly as it was. */
const IGNORED: Record<GroupState, GroupEventType[]> = {
  'forming': ['sync.completed', 'resync.completed', 'regroup.completed'],
  'running.sync.stepping': ['member.joined', 'member.rejoined', 'sync.completed', 'resync.completed', 'regroup.completed'],
  'running.sync.reducing': ['member.joined', 'member.rejoined', 'resync.completed', 'regroup.completed'],
  'running.async': ['member.joined', 'member.rejoined', 'sync.completed', 'resync.completed', 'regroup.completed'],
  'degraded': ['member.joined', 'resync.completed', 'regroup.completed'],
  'resyncing': ['member.joined', 'member.rejoined', 'sync.completed', 'regroup.completed'],
  'regrouping': ['member.joined', 'member.rejoined', 'member.lost', 'member.dead', 'group.partitioned', 'sync.completed', 'resync.completed', 'group.regroup'],
  'stopped': [],
};

test('model: events that do not apply to a state change nothing, in every reachable snapshot', () => {
  let checked = 0;
  for (const { state: from, transitions } of Object.values(adjacency)) {
    const ignored = IGNORED[groupStateOf(from)];
    for (const { event, state: to } of Object.values(transitions)) {
      if (!ignored.includes(event.type as GroupEventType)) continue;
      assert.equal(serialize(to), serialize(from), `${groupStateOf(from)} should ignore ${JSON.stringify(event)}`);
      checked++;
    }
  }
  assert.ok(checked > 1_000, `checked ${checked} ignored events`);
});

test('model: a sync round only starts once every active member has done syncSteps steps', () => {
  for (const { state: from, transitions } of Object.values(adjacency)) {
    for (const { state: to } of Object.values(transitions)) {
      if (groupStateOf(to) !== 'running.sync.reducing' || groupStateOf(from) === 'running.sync.reducing') continue;
      assert.equal(to.context.startedRound, from.context.startedRound + 1);
      const active = from.context.members.filter((m) => !from.context.lost.includes(m));
      assert.ok(active.length > 0);
    }
  }
});

// ------------------------------------------------------------ forming

test('forming: after the timeout the group runs with the members that joined and drops the rest', () => {
  const g = start({ members: ['a', 'b', 'c'] });
  g.send(ev.memberJoined('a'), ev.memberJoined('b'));
  g.clock.increment(FORMING_MS - 1);
  assert.equal(g.state(), 'forming');
  g.clock.increment(1);
  assert.equal(g.state(), 'running.sync.stepping');
  assert.deepEqual(g.ctx().members, ['a', 'b']);
  assert.deepEqual(ofType(g.emitted, 'members.dropped'), [{ type: 'members.dropped', group: 'g', members: ['c'], reason: 'forming-timeout' }]);
});

test('forming: with nobody joined the timeout re-arms and says the group is stalled', () => {
  const g = start();
  g.clock.increment(FORMING_MS);
  assert.equal(g.state(), 'forming');
  assert.deepEqual(ofType(g.emitted, 'forming.stalled'), [{ type: 'forming.stalled', group: 'g', expected: ['a', 'b'] }]);
  g.send(ev.memberJoined('b'));
  g.clock.increment(FORMING_MS);
  assert.equal(g.state(), 'running.sync.stepping');
  assert.deepEqual(g.ctx().members, ['b']);
});

test('forming: all members joined starts running at once and cancels the timeout', () => {
  const g = start({ policy: policy('async') });
  g.send(ev.memberJoined('a'), ev.memberJoined('x'), ev.memberJoined('a'));
  assert.equal(g.state(), 'forming');
  assert.deepEqual(g.ctx().joined, ['a'], 'strangers and repeats do not count');
  g.send(ev.memberJoined('b'));
  assert.equal(g.state(), 'running.async');
  assert.equal(g.clock.pendingTimers, 0);
});

test('forming: a member lost before the group formed has to join again', () => {
  const g = start({ members: ['a', 'b', 'c'] });
  g.send(ev.memberJoined('a'), ev.memberJoined('b'), ev.memberLost('a'), ev.partitioned(['b']));
  assert.deepEqual(g.ctx().joined, []);
  g.send(ev.memberRejoined('a'), ev.memberJoined('b'), ev.memberJoined('c'));
  assert.equal(g.state(), 'running.sync.stepping');
});

test('forming ignores sync.completed, resync.completed and regroup.completed', () => {
  const g = start();
  g.send(ev.memberJoined('a'));
  const before = serialize(g.actor.getSnapshot());
  g.send(ev.syncCompleted(1, 9), ev.resyncCompleted(9), ev.regroupCompleted([], policy('async')));
  assert.equal(serialize(g.actor.getSnapshot()), before);
});

// ------------------------------------------------------------ sync strategies

test('shouldSync: each strategy on plain data', () => {
  const at = (p: SyncPolicy, steps: Record<string, number>, lost: string[] = []) =>
    shouldSync({ policy: p, members: Object.keys(steps), lost, stepsSinceSync: steps });
  // fixed: a barrier every syncSteps steps
  assert.equal(at(policy('sync', 3), { a: 3, b: 2 }), false);
  assert.equal(at(policy('sync', 3), { a: 3, b: 3 }), true);
  assert.equal(at(policy('sync', 3), { a: 3, b: 2 }, ['b']), true, 'a lost member does not hold the barrier');
  // accumulation: every member accumulated accumulationSteps gradients
  assert.equal(at(policy('accumulation', 4), { a: 9, b: 3 }), false);
  assert.equal(at(policy('accumulation', 4), { a: 4, b: 4 }), true);
  // adaptive: the fastest leads the slowest by the threshold
  assert.equal(at(policy('adaptive', 2), { a: 2, b: 1 }), false);
  assert.equal(at(policy('adaptive', 2), { a: 3, b: 1 }), true);
  assert.equal(at(policy('adaptive', 2), { a: 50, b: 50 }), false, 'no drift, no round (without adaptiveMaxSteps)');
  assert.equal(at(policy('adaptive', 2, 40), { a: 40, b: 40 }), true, 'adaptiveMaxSteps bounds a drift-free group');
  assert.equal(at(policy('adaptive', 2), { a: 2 }), false, 'one member never drifts');
  // async: never; nobody active: never
  assert.equal(at(policy('async'), { a: 100, b: 0 }), false);
  assert.equal(at(policy('sync', 1), { a: 5 }, ['a']), false);
});

test('fixed-step sync: a round every syncSteps steps of every member, answered by its sync.completed', () => {
  const g = running({ policy: policy('sync', 2) });
  g.send(ev.stepCompleted('a', 1), ev.stepCompleted('a', 2), ev.stepCompleted('b', 1));
  assert.equal(g.state(), 'running.sync.stepping');
  g.send(ev.stepCompleted('b', 1)); // a repeat does not count
  assert.equal(g.state(), 'running.sync.stepping');
  g.send(ev.stepCompleted('b', 2));
  assert.equal(g.state(), 'running.sync.reducing');
  assert.deepEqual(ofType(g.emitted, 'sync.due'), [{ type: 'sync.due', group: 'g', round: 1, members: ['a', 'b'], version: 0 }]);
  g.send(ev.syncCompleted(2, 5)); // not the round in flight
  assert.equal(g.state(), 'running.sync.reducing');
  g.send(ev.syncCompleted(1, 5));
  assert.equal(g.state(), 'running.sync.stepping');
  assert.equal(g.ctx().version, 5);
  assert.equal(g.ctx().completedRound, 1);
  g.send(ev.stepCompleted('a', 4), ev.stepCompleted('b', 3)); // a skipped a report: 2 steps
  assert.equal(g.state(), 'running.sync.stepping');
  g.send(ev.stepCompleted('b', 4));
  assert.equal(ofType(g.emitted, 'sync.due').at(-1)?.round, 2);
});

test('fixed-step sync: steps taken while a round is in flight count towards the next one', () => {
  const g = running({ policy: policy('sync', 1) });
  g.send(ev.stepCompleted('a', 1), ev.stepCompleted('b', 1));
  assert.equal(g.state(), 'running.sync.reducing');
  g.send(ev.stepCompleted('a', 2), ev.stepCompleted('b', 2));
  g.send(ev.syncCompleted(1, 1));
  assert.equal(g.state(), 'running.sync.reducing', 'round 2 starts right away');
  assert.equal(g.ctx().startedRound, 2);
});

test('adaptive sync: a round when the fastest member leads the slowest by the threshold', () => {
  const g = running({ policy: policy('adaptive', 2) });
  g.send(ev.stepCompleted('b', 1), ev.stepCompleted('a', 1), ev.stepCompleted('a', 2));
  assert.equal(g.state(), 'running.sync.stepping', 'a leads by 1');
  g.send(ev.stepCompleted('b', 2), ev.stepCompleted('a', 3));
  assert.equal(g.state(), 'running.sync.stepping', 'a leads by 1 again');
  g.send(ev.stepCompleted('a', 4));
  assert.equal(g.state(), 'running.sync.reducing', 'a leads by 2');
  g.send(ev.syncCompleted(1, 1));
  for (let s = 3; s <= 20; s++) g.send(ev.stepCompleted('b', s), ev.stepCompleted('a', s + 2));
  assert.equal(g.state(), 'running.sync.stepping', 'in lockstep after the round: no drift, no round');
  assert.equal(ofType(g.emitted, 'sync.due').length, 1);
});

test('adaptive sync: adaptiveMaxSteps bounds the steps between rounds of a group that does not drift', () => {
  const g = running({ policy: policy('adaptive', 3, 5) });
  for (let s = 1; s <= 4; s++) g.send(ev.stepCompleted('a', s), ev.stepCompleted('b', s));
  assert.equal(g.state(), 'running.sync.stepping');
  g.send(ev.stepCompleted('a', 5));
  assert.equal(g.state(), 'running.sync.reducing');
});

test('accumulation: a round once every member accumulated accumulationSteps gradients', () => {
  const g = running({ policy: policy('accumulation', 3) });
  for (let s = 1; s <= 6; s++) g.send(ev.stepCompleted('a', s));
  g.send(ev.stepCompleted('b', 1), ev.stepCompleted('b', 2));
  assert.equal(g.state(), 'running.sync.stepping');
  g.send(ev.stepCompleted('b', 3));
  assert.equal(g.state(), 'running.sync.reducing');
  assert.equal(ofType(g.emitted, 'sync.due').length, 1);
});

test('readiness: a round starts once every active member is ready for it, whatever its steps; early reports count for their own round', () => {
  const g = running({ policy: policy('sync', 4) });
  g.send(ev.stepCompleted('a', 1), ev.memberReady('a', 1));
  assert.equal(g.state(), 'running.sync.stepping', 'b is not ready yet');
  g.send(ev.memberReady('b', 2));
  assert.equal(g.state(), 'running.sync.reducing', 'b ready for round 2 is ready for round 1 too (it closed both windows)');
  assert.deepEqual(ofType(g.emitted, 'sync.due').map((e) => e.round), [1]);
  g.send(ev.memberReady('a', 2));
  assert.equal(g.state(), 'running.sync.reducing', 'round 2 waits for round 1 to complete');
  g.send(ev.syncCompleted(1, 1));
  assert.equal(g.state(), 'running.sync.reducing', 'both were already ready for round 2: it starts at once');
  assert.deepEqual(ofType(g.emitted, 'sync.due').map((e) => e.round), [1, 2]);
  g.send(ev.memberReady('x', 3), ev.syncCompleted(2, 2));
  assert.equal(g.state(), 'running.sync.stepping', 'a non-member\'s readiness counts for nothing');
});

test('readiness: sync.requested (adaptive) starts the round at once; a request for a finished round starts nothing', () => {
  const g = running({ policy: policy('adaptive', 3), members: ['a', 'b', 'c'] });
  g.send(ev.syncRequested('b', 1));
  assert.equal(g.state(), 'running.sync.reducing');
  assert.deepEqual(ofType(g.emitted, 'sync.due')[0]!.members, ['a', 'b', 'c']);
  g.send(ev.syncCompleted(1, 1), ev.syncRequested('a', 1));
  assert.equal(g.state(), 'running.sync.stepping', 'a request for a round already done starts nothing');
});

test('async: members push on their own; no rounds, sync.completed ignored', () => {
  const g = running({ policy: policy('async') });
  assert.equal(g.state(), 'running.async');
  for (let s = 1; s <= 10; s++) g.send(ev.stepCompleted('a', s));
  g.send(ev.syncCompleted(1, 1));
  assert.equal(g.state(), 'running.async');
  assert.equal(ofType(g.emitted, 'sync.due').length, 0);
  assert.equal(g.ctx().version, 0);
});

test('syncPolicyFromConfig keeps the configured parameter and no max-steps bound', () => {
  assert.deepEqual(
    syncPolicyFromConfig({ name: 'fast', nodes: ['a'], sync_mode: 'adaptive', sync_steps: null, accumulation_steps: null, adaptive_threshold: 6 }),
    { syncMode: 'adaptive', syncSteps: null, accumulationSteps: null, adaptiveThreshold: 6, adaptiveMaxSteps: null },
  );
});

// ------------------------------------------------------------ degraded, resyncing

test('degraded → resyncing → running: the lost member rejoins, everyone is brought to one version', () => {
  const g = running({ members: ['a', 'b', 'c'], policy: policy('sync', 1) });
  g.send(ev.stepCompleted('a', 1), ev.stepCompleted('b', 1), ev.stepCompleted('c', 1));
  assert.equal(g.state(), 'running.sync.reducing');
  g.send(ev.memberLost('c'));
  assert.equal(g.state(), 'degraded', 'a partition abandons the round in flight');
  assert.deepEqual(g.ctx().lost, ['c']);
  g.send(ev.syncCompleted(1, 1), ev.stepCompleted('a', 2), ev.stepCompleted('b', 2));
  assert.equal(g.state(), 'degraded', 'no rounds while degraded');
  g.send(ev.partitioned(['b', 'x']));
  assert.deepEqual(g.ctx().lost, ['b', 'c']);
  g.send(ev.memberRejoined('c'));
  assert.equal(g.state(), 'degraded', 'b is still away');
  g.send(ev.memberRejoined('b'));
  assert.equal(g.state(), 'resyncing');
  assert.deepEqual(ofType(g.emitted, 'resync.due'), [{ type: 'resync.due', group: 'g', version: 0, members: ['a', 'b', 'c'] }]);
  g.send(ev.resyncCompleted(4));
  assert.equal(g.state(), 'running.sync.stepping');
  assert.equal(g.ctx().version, 4);
  assert.deepEqual(g.ctx().stepsSinceSync, { a: 0, b: 0, c: 0 }, 'steps taken while degraded do not count');
  assert.equal(g.clock.pendingTimers, 0, 'the recovery timeout is cancelled');
  g.send(ev.stepCompleted('a', 3), ev.stepCompleted('b', 3), ev.stepCompleted('c', 3));
  assert.equal(ofType(g.emitted, 'sync.due').at(-1)?.round, 2, 'the abandoned round number is not reused');
});

test('degraded: after the recovery timeout the group resyncs without the lost members', () => {
  const g = running({ members: ['a', 'b', 'c'], policy: policy('async') });
  g.send(ev.partitioned(['b', 'c']));
  assert.equal(g.state(), 'degraded');
  g.clock.increment(RECOVERY_MS - 1);
  g.send(ev.memberLost('a')); // a later loss does not extend the timeout...
  g.send(ev.memberRejoined('a'));
  g.clock.increment(1);
  assert.equal(g.state(), 'resyncing');
  assert.deepEqual(g.ctx().members, ['a']);
  assert.deepEqual(ofType(g.emitted, 'members.dropped'), [{ type: 'members.dropped', group: 'g', members: ['b', 'c'], reason: 'recovery-timeout' }]);
  g.send(ev.resyncCompleted(2));
  assert.equal(g.state(), 'running.async', 'back to the mode of the group');
});

test('a dead verdict degrades the group to async at once; the recovery timeout does not drop it (the driver re-forms the group)', () => {
  const g = running({ members: ['a', 'b', 'c'] });
  g.send(ev.memberDead('c'));
  assert.equal(g.state(), 'degraded');
  assert.deepEqual([g.ctx().members, g.ctx().lost, g.ctx().cut], [['a', 'b', 'c'], ['c'], ['c']]);
  assert.deepEqual(ofType(g.emitted, 'members.dropped'), [], 'a dead member is not dropped here: the re-form leaves it out');
  g.clock.increment(RECOVERY_MS * 3);
  assert.equal(g.state(), 'degraded', 'only the driver ends it');
  g.send(ev.memberRejoined('c'));
  assert.equal(g.state(), 'degraded', 'alive again: taken back by the driver\'s re-form, not by the replica');
  // The last member standing is never cut by a verdict about itself.
  g.send(ev.memberDead('b'));
  assert.deepEqual(g.ctx().cut, ['b', 'c']);
  g.send(ev.memberDead('a'));
  assert.deepEqual(g.ctx().cut, ['b', 'c']);
  g.send(ev.regroup('re-form'));
  assert.equal(g.state(), 'regrouping');
  g.send(ev.regroupCompleted(['a', 'b', 'c'], policy('sync', 1)));
  assert.deepEqual([g.state(), g.ctx().lost, g.ctx().cut], ['forming', [], []]);
});

test('degraded by a dead member: a round under way finishes among the others, and one every other member is ready for still starts', () => {
  const g = running({ members: ['a', 'b', 'c'], policy: policy('sync', 1) });
  g.send(ev.stepCompleted('a', 1), ev.stepCompleted('b', 1), ev.stepCompleted('c', 1));
  assert.equal(g.state(), 'running.sync.reducing');
  g.send(ev.memberDead('c'));
  assert.equal(g.state(), 'degraded');
  g.send(ev.syncCompleted(1, 7));
  assert.deepEqual([g.ctx().completedRound, g.ctx().version], [1, 7], 'the round in flight completes');
  // Windows begun in sync before the verdict reached everyone: their round runs among a and b.
  g.send(ev.memberReady('a', 2));
  assert.equal(ofType(g.emitted, 'sync.due').length, 1, 'b is not ready yet');
  g.send(ev.memberReady('b', 2));
  assert.deepEqual(ofType(g.emitted, 'sync.due').at(-1), { type: 'sync.due', group: 'g', round: 2, members: ['a', 'b'], version: 7 });
  assert.equal(g.state(), 'degraded');
  g.send(ev.syncCompleted(2, 9));
  assert.equal(g.ctx().completedRound, 2);
  // Steps alone never start a round while degraded (members push their windows alone).
  g.send(ev.stepCompleted('a', 5), ev.stepCompleted('b', 5));
  assert.equal(ofType(g.emitted, 'sync.due').length, 2);
});

test('forming: a member dead by the verdicts is not waited for', () => {
  const g = start({ members: ['a', 'b', 'c'] });
  g.send(ev.memberJoined('a'), ev.memberDead('c'));
  assert.deepEqual(ofType(g.emitted, 'members.dropped'), [{ type: 'members.dropped', group: 'g', members: ['c'], reason: 'dead' }]);
  assert.equal(g.state(), 'forming');
  g.send(ev.memberJoined('b'));
  assert.equal(g.state(), 'running.sync.stepping');
  assert.deepEqual(g.ctx().members, ['a', 'b']);
  assert.equal(g.clock.pendingTimers, 0, 'formed before the forming timeout');
});

test('degraded: with every member lost the recovery timeout re-arms instead of dropping the group', () => {
  const g = running();
  g.send(ev.partitioned(['a', 'b']));
  g.clock.increment(RECOVERY_MS);
  assert.equal(g.state(), 'degraded');
  assert.deepEqual(g.ctx().members, ['a', 'b']);
  g.send(ev.memberRejoined('a'));
  g.clock.increment(RECOVERY_MS);
  assert.equal(g.state(), 'resyncing');
  assert.deepEqual(g.ctx().members, ['a']);
});

test('resyncing: losing a member again goes back to degraded', () => {
  const g = running();
  g.send(ev.memberLost('b'), ev.memberRejoined('b'));
  assert.equal(g.state(), 'resyncing');
  g.send(ev.memberLost('a'));
  assert.equal(g.state(), 'degraded');
  g.send(ev.memberRejoined('a'));
  assert.equal(ofType(g.emitted, 'resync.due').length, 2);
});

test('losses of non-members or of already lost members are ignored', () => {
  const g = running();
  g.send(ev.memberLost('x'), ev.partitioned(['x', 'y']));
  assert.equal(g.state(), 'running.sync.stepping');
  g.send(ev.memberLost('a'));
  const before = serialize(g.actor.getSnapshot());
  g.send(ev.memberLost('a'), ev.partitioned(['a']), ev.memberRejoined('x'));
  assert.equal(serialize(g.actor.getSnapshot()), before);
});

// ------------------------------------------------------------ regrouping, stopping

test('regroup → forming with the new membership and sync mode', () => {
  const g = running();
  g.send(ev.stepCompleted('a', 1), ev.regroup('rebalance'));
  assert.equal(g.state(), 'regrouping');
  assert.equal(g.ctx().regroupReason, 'rebalance');
  g.send(ev.memberLost('a'), ev.syncCompleted(1, 1), ev.stepCompleted('a', 1));
  assert.equal(g.state(), 'regrouping');
  g.send(ev.regroupCompleted(['c', 'a'], policy('async')));
  assert.equal(g.state(), 'forming');
  assert.deepEqual(g.ctx().members, ['a', 'c']);
  assert.deepEqual(g.ctx().joined, []);
  g.send(ev.memberJoined('a'), ev.memberJoined('c'));
  assert.equal(g.state(), 'running.async');
});

test('regroup with no members dissolves the group', () => {
  const g = running();
  g.send(ev.memberLost('a'), ev.regroup('node removed'), ev.regroupCompleted([], policy('async')));
  assert.equal(g.state(), 'stopped');
  assert.equal(g.actor.getSnapshot().status, 'done');
  assert.equal(g.actor.getSnapshot().output?.reason, 'dissolved');
});

test('group.stop stops the group from every state', () => {
  for (const target of GROUP_STATES.filter((s) => s !== 'stopped')) {
    const path = shortestPathTo(target);
    assert.ok(path, `a path to ${target}`);
    const actor = replay(modelMachine, path.steps.slice(1).map((s) => s.event), new Set(), () => {});
    assert.equal(groupStateOf(actor.getSnapshot()), target);
    actor.send(ev.stop('operator'));
    assert.equal(groupStateOf(actor.getSnapshot()), 'stopped', `from ${target}`);
    assert.equal(actor.getSnapshot().status, 'done');
    assert.equal(actor.getSnapshot().output?.reason, 'operator');
  }
});

test('stopped is final: nothing moves it, timers are gone', () => {
  const g = start({ members: ['a', 'b', 'c'] });
  g.send(ev.memberJoined('a'), ev.stop('bye'));
  assert.equal(g.clock.pendingTimers, 0);
  g.send(ev.memberJoined('b'), ev.memberJoined('c'), ev.regroup('x'));
  g.clock.increment(FORMING_MS * 10);
  assert.equal(g.state(), 'stopped');
});

// ------------------------------------------------------------ input

test('bad input and bad regroup policies are rejected with ValidationError', () => {
  assert.throws(() => createGroupMachine(input({ members: [] })), ValidationError);
  assert.throws(() => createGroupMachine(input({ members: ['a', 'a'] })), ValidationError);
  assert.throws(() => createGroupMachine(input({ formingTimeoutMs: 0 })), ValidationError);
  assert.throws(() => createGroupMachine(input({ policy: policy('sync') })), /needs syncSteps/);
  assert.throws(() => createGroupMachine(input({ policy: policy('adaptive', 2.5) })), /adaptiveThreshold/);
  assert.throws(() => ev.regroupCompleted(['a'], policy('accumulation')), ValidationError);
  assert.throws(() => ev.regroupCompleted(['a', 'a'], policy('async')), ValidationError);
  assert.doesNotThrow(() => createGroupMachine(input({ policy: policy('async') })));
});

test('two actors of one machine do not share context', () => {
  const machine = createGroupMachine(input());
  const clock = toXStateClock(new SimulatedClock());
  const one = createActor(machine, { clock }).start();
  const two = createActor(machine, { clock }).start();
  one.send(ev.memberJoined('a'));
  assert.deepEqual(two.getSnapshot().context.joined, []);
  one.stop(); two.stop();
});
