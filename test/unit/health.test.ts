/**
 * Health verdicts: the rule (topology/health.ts) on plain data, and the
 * health actor on the in-process bus with a simulated clock — heartbeats in,
 * alive → suspect → dead transitions out on tel.health, an exit seen by a
 * parent makes a node dead at once, a restarted process is alive again.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  ActorSystem, InProcessBroker, SeededRandom, SimulatedClock, connectTransport, decode, encode, heartbeatSubject, telemetryWildcard,
} from '../../runtime/mod.ts';
import { observerStalled, onExit, onHeartbeat, onTick, suspectAfterMs, type HealthPolicy, type NodeHealth } from '../../topology/mod.ts';
import { createHealthActor, HEALTH_ACTOR_ID } from '../../actors/health/health.actor.ts';
import { HeartbeatPublisher } from '../../actors/health/heartbeat.ts';
import { HealthWatcher } from '../../actors/health/health-watcher.ts';
import type { HealthVerdictMessage, HealthVerdicts } from '../../actors/health/health.messages.ts';

const policy: HealthPolicy = { heartbeatMs: 250, deadAfterMs: 1_000 };
const hb = (seq: number, incarnation = 'a', state = 'training') => ({ node: 'w1', role: 'worker', incarnation, state, seq });

test('the verdict rule: alive on a heartbeat, suspect after the suspect time, dead after dead_after_ms, alive again on the next heartbeat', () => {
  assert.equal(suspectAfterMs(policy), 500);
  let h: NodeHealth = onHeartbeat(null, hb(1), 0);
  assert.equal(h.state, 'alive');
  h = onTick(h, 500, policy);
  assert.equal(h.state, 'alive', 'two periods of silence is not yet suspect');
  h = onTick(h, 501, policy);
  assert.equal(h.state, 'suspect');
  assert.equal(h.sinceMs, 501);
  h = onTick(h, 999, policy);
  assert.equal(h.state, 'suspect');
  h = onTick(h, 1_000, policy);
  assert.equal(h.state, 'dead');
  assert.match(h.reason, /no heartbeat for 1000 ms/);
  assert.equal(onTick(h, 50_000, policy), h, 'dead stays dead without heartbeats');
  h = onHeartbeat(h, hb(2), 1_200);
  assert.equal(h.state, 'alive');
  assert.match(h.reason, /heartbeats again after 1200 ms/);
});

test('the verdict rule: an exit is dead at once; a leaving node is dead (left); a new incarnation is alive; an old heartbeat does not revive', () => {
  let h = onHeartbeat(null, hb(5), 0);
  h = onExit(h, 10, 'signal SIGKILL');
  assert.equal(h.state, 'dead');
  assert.match(h.reason, /SIGKILL/);
  assert.equal(onHeartbeat(h, hb(4), 20).state, 'dead', 'a late heartbeat of the dead process');
  const restarted = onHeartbeat(h, hb(1, 'b'), 30);
  assert.equal(restarted.state, 'alive');
  assert.match(restarted.reason, /restarted/);
  const left = onHeartbeat(onHeartbeat(null, hb(1), 0), hb(2, 'a', 'stopped'), 5);
  assert.equal(left.state, 'dead');
  assert.match(left.reason, /^left/);
  assert.equal(onExit(left, 6, 'code 0').reason, left.reason, 'a node that left is not re-reported as crashed');
  // Policies where two periods exceed half the dead time still suspect before dead.
  assert.ok(suspectAfterMs({ heartbeatMs: 600, deadAfterMs: 1_000 }) < 1_000);
});

test('health actor: heartbeats in, transitions out on tel.health; verdicts on request; exited makes a node dead at once', async () => {
  const clock = new SimulatedClock(1_000_000);
  const broker = new InProcessBroker();
  const t = await connectTransport({ servers: null, broker, name: 'h' });
  const system = new ActorSystem({ transport: t, job: 'hj', node: 'scheduler', clock, random: new SeededRandom(1) });
  const seen: HealthVerdictMessage[] = [];
  t.subscribe(telemetryWildcard('hj', 'health'), (m) => { seen.push(decode(m.data) as HealthVerdictMessage); });
  await system.spawn(createHealthActor({ policy }));
  const nodeT = await connectTransport({ servers: null, broker, name: 'w1' });
  const beats = new HeartbeatPublisher({ transport: nodeT, job: 'hj', node: 'w1', role: 'worker', incarnation: 'x1', periodMs: 250, clock, state: () => 'training' }).start();
  const other = new HeartbeatPublisher({ transport: nodeT, job: 'hj', node: 's1', role: 'shard', incarnation: 'y1', periodMs: 250, clock }).start();
  const watcher = await HealthWatcher.start(system);
  try {
    await t.flush();
    await new Promise((r) => setImmediate(r));
    const step = async (ms: number) => { for (let i = 0; i < ms / 50; i++) { clock.increment(50); await new Promise((r) => setImmediate(r)); } };
    await step(1_000);
    assert.deepEqual(seen.map((v) => `${v.node}:${v.state}`), ['w1:alive', 's1:alive']);
    assert.equal(watcher.stateOf('w1'), 'alive');
    // A malformed heartbeat does not count as one.
    nodeT.publish(heartbeatSubject('hj', 'w1'), encode({ node: 'w1', seq: 'x' }));
    beats.stop(false); // silent: the process hangs or is cut off
    await step(600);
    assert.equal(seen.at(-1)!.state, 'suspect');
    await step(500);
    const dead = seen.at(-1)!;
    assert.equal(dead.node, 'w1');
    assert.equal(dead.state, 'dead');
    assert.equal(dead.role, 'worker');
    assert.match(dead.reason, /no heartbeat/);
    assert.equal(watcher.stateOf('w1'), 'dead');
    const v = await system.ref('health', HEALTH_ACTOR_ID).request<HealthVerdicts & Record<string, unknown>>('verdicts');
    assert.deepEqual(v.nodes.map((n) => `${n.node}:${n.state}`), ['s1:alive', 'w1:dead']);
    assert.ok(v.nodes.find((n) => n.node === 'w1')!.last_heartbeat_ms! >= 1_000);
    // The process of s1 exits (its parent saw it): dead now, not after dead_after_ms.
    other.stop(false);
    await system.ref('health', HEALTH_ACTOR_ID).request('exited', { node: 's1', how: 'signal SIGKILL' });
    assert.equal(seen.at(-1)!.node, 's1');
    assert.equal(seen.at(-1)!.state, 'dead');
    assert.match(seen.at(-1)!.reason, /SIGKILL/);
    // w1 comes back as a new process.
    const again = new HeartbeatPublisher({ transport: nodeT, job: 'hj', node: 'w1', role: 'worker', incarnation: 'x2', periodMs: 250, clock }).start();
    await step(100);
    assert.equal(watcher.stateOf('w1'), 'alive');
    again.stop(true);
    await step(100);
    assert.equal(watcher.stateOf('w1'), 'dead', 'a node that says it stops is dead at once (left)');
    assert.match(seen.at(-1)!.reason, /^left/);
  } finally {
    beats.stop(false); other.stop(false);
    watcher.dispose();
    await system.stop();
    await t.close(); await nodeT.close();
  }
});

test('the verdict rule: an observer held up for more than a period does not judge until the queued heartbeats are in', () => {
  assert.equal(observerStalled(0, 100, 100, policy), false);
  assert.equal(observerStalled(0, 350, 100, policy), false);
  assert.equal(observerStalled(0, 351, 100, policy), true);
  assert.equal(observerStalled(0, 5_000, 100, policy), true);
});
