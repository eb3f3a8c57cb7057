/**
 * The scheduler lease's rules on an in-memory KV and simulated clocks:
 * renewal, expiry, takeover by a standby, a driver refused by a live holder
 * and taking a crashed one's lease, and a deposed holder that wakes up to a
 * moved revision stepping down without writing.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimulatedClock } from '../../runtime/clock.ts';
import {
  DEFAULT_SCHEDULER_LEASE_MS, LeaseHeldError, LeaseLostError, LeaseStandby, MemoryLeaseKv, acquireLease, judgeLease, observeLease,
  type LeaseKv, type LeaseRecord, type StandbyOutcome,
} from '../../actors/scheduler/lease.ts';

const LEASE = DEFAULT_SCHEDULER_LEASE_MS;

/** The memory KV, with every successful write recorded by writer. */
class RecordingKv implements LeaseKv {
  readonly inner = new MemoryLeaseKv();
  readonly writes: { holder: string; state: string; term: number; revision: number }[] = [];
  /** Write calls, successful or not, by writer. */
  readonly attempts: string[] = [];
  get() { return this.inner.get(); }
  async create(r: LeaseRecord) { this.attempts.push(r.holder); const rev = await this.inner.create(r); this.writes.push({ holder: r.holder, state: r.state, term: r.term, revision: rev }); return rev; }
  async update(r: LeaseRecord, revision: number) { this.attempts.push(r.holder); const rev = await this.inner.update(r, revision); this.writes.push({ holder: r.holder, state: r.state, term: r.term, revision: rev }); return rev; }
}

const flush = async () => { for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r)); };

/** Moves the clock forward in steps, letting the KV calls each step started finish. */
async function advance(clock: SimulatedClock, ms: number, step = 25): Promise<void> {
  for (let t = 0; t < ms; t += step) {
    clock.increment(Math.min(step, ms - t));
    await flush();
  }
}

const id = (holder: string) => ({ holder, incarnation: `${holder}#1` });

async function acquire(kv: LeaseKv, clock: SimulatedClock, holder: string) {
  const p = acquireLease({ kv, clock, identity: id(holder), runId: 'run-1', job: 'j' });
  let settled = false;
  void p.then(() => { settled = true; }, () => { settled = true; });
  for (let i = 0; i < 400 && !settled; i++) await advance(clock, 25);
  return p;
}

test('observe and judge: a revision that stands for lease_ms has expired; one that moves is live; released and absent are told apart', () => {
  const rec = (state: 'held' | 'released'): LeaseRecord => ({
    state, holder: 'a', incarnation: 'a#1', run_id: null, term: 1, lease_ms: 2000, renewed_at_ms: 0, expires_at_ms: 2000, reason: null, takeovers: [],
  });
  let obs = observeLease(null, { revision: 1, record: rec('held') }, 0);
  assert.equal(judgeLease(obs, 1999), 'live');
  assert.equal(judgeLease(obs, 2000), 'expired');
  obs = observeLease(obs, { revision: 2, record: rec('held') }, 1500);
  assert.equal(obs.since, 1500, 'a moved revision restarts the wait');
  assert.equal(judgeLease(obs, 3000), 'live');
  assert.equal(judgeLease(observeLease(obs, { revision: 2, record: rec('held') }, 3400), 3500), 'expired', 'the same revision keeps its first sighting');
  assert.equal(judgeLease(observeLease(null, { revision: 3, record: rec('released') }, 0), 10_000), 'released');
  assert.equal(judgeLease(observeLease(null, null, 0), 10_000), 'absent');
  assert.equal(judgeLease(observeLease(null, { revision: 4, record: null }, 0), 10_000), 'absent', 'a deleted key is no lease');
});

test('a renewing holder moves the revision every renewal, and a standby watching for 10 s never takes over', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const holder = await acquire(kv, clock, 'driver-a');
  assert.equal(holder.term, 1);
  const standby = new LeaseStandby({ kv, clock, identity: id('driver-b') });
  let outcome: StandbyOutcome | null = null;
  void standby.wait().then((o) => { outcome = o; });
  await advance(clock, 10_000);
  assert.equal(outcome, null, 'no takeover while the holder renews');
  assert.ok(holder.renewals >= 18 && holder.renewals <= 21, `renewals in 10 s: ${holder.renewals}`);
  assert.ok(kv.writes.every((w) => w.holder === 'driver-a'));
  standby.stop();
  await flush();
  assert.deepEqual(outcome, { kind: 'stopped' });
  holder.stop();
});

test('a holder that stops renewing (its process died) is taken over by the standby after lease_ms, with term + 1 and the gap recorded', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const holder = await acquire(kv, clock, 'driver-a');
  const holders: string[] = [];
  const standby = new LeaseStandby({ kv, clock, identity: id('driver-b'), onHolder: (r) => holders.push(r.holder) });
  let outcome: StandbyOutcome | null = null;
  let tookAt = 0;
  void standby.wait().then((o) => { outcome = o; tookAt = clock.monotonic(); });
  await advance(clock, 1_000);
  holder.stop(); // a SIGKILL: no release
  const lastRenewal = clock.monotonic();
  await advance(clock, LEASE - 100);
  assert.equal(outcome, null, 'not before lease_ms');
  await advance(clock, 1_000);
  assert.ok(outcome, 'taken over');
  const o = outcome as StandbyOutcome;
  assert.equal(o.kind, 'took_over');
  if (o.kind !== 'took_over') return;
  const after = tookAt - lastRenewal;
  assert.ok(after >= LEASE - 500 && after <= LEASE + 300, `takeover ${after} ms after the last renewal`);
  assert.deepEqual(holders, ['driver-a']);
  assert.equal(o.takeover.from, 'driver-a');
  assert.equal(o.takeover.to, 'driver-b');
  assert.equal(o.takeover.term, 2);
  assert.ok(o.takeover.lease_gap_ms >= LEASE, `gap ${o.takeover.lease_gap_ms}`);
  assert.equal(o.holder.term, 2);
  assert.deepEqual(o.holder.takeovers.map((t) => t.to), ['driver-b']);
  const stored = (await kv.get())!.record!;
  assert.equal(stored.holder, 'driver-b');
  assert.equal(stored.run_id, 'run-1', 'the run id carries over');
  // The new holder renews in turn.
  const before = o.holder.renewals;
  await advance(clock, 1_100);
  assert.ok(o.holder.renewals >= before + 2);
  o.holder.stop();
});

test('a deposed holder that wakes up finds the revision moved: it steps down and never writes', async () => {
  // Two processes, two clocks: the holder's stands still (SIGSTOP), the standby's runs.
  const holderClock = new SimulatedClock(1_000_000);
  const standbyClock = new SimulatedClock(5_000_000);
  const kv = new RecordingKv();
  const holder = await acquire(kv, holderClock, 'driver-a');
  const lost: LeaseLostError[] = [];
  holder.onLost((e) => lost.push(e));
  await advance(holderClock, 600);
  const standby = new LeaseStandby({ kv, clock: standbyClock, identity: id('driver-b') });
  let outcome: StandbyOutcome | null = null;
  void standby.wait().then((o) => { outcome = o; });
  await advance(standbyClock, LEASE + 600);
  assert.equal((outcome as StandbyOutcome | null)?.kind, 'took_over');
  const writesAtTakeover = kv.writes.length;
  const holderWrites = kv.writes.filter((w) => w.holder === 'driver-a').length;
  const holderAttempts = kv.attempts.filter((h) => h === 'driver-a').length;
  // The old holder wakes up: its clock has jumped past its lease, and its renewal timer fires once, late.
  holder.stop();
  holderClock.increment(LEASE + 1_000);
  await holder.renew();
  assert.equal(holder.held, false);
  assert.equal(kv.attempts.filter((h) => h === 'driver-a').length, holderAttempts, 'it did not even try to write');
  assert.ok(holder.lost instanceof LeaseLostError);
  assert.equal(lost.length, 1);
  assert.match(lost[0]!.message, /moved to driver-b \(term 2\)/);
  assert.equal(kv.writes.filter((w) => w.holder === 'driver-a').length, holderWrites, 'no write from the deposed holder');
  // Its release is refused locally too: it holds nothing.
  await holder.release('done');
  assert.equal(kv.writes.filter((w) => w.holder === 'driver-a').length, holderWrites);
  assert.ok(kv.writes.length >= writesAtTakeover);
  assert.equal((await kv.get())!.record!.holder, 'driver-b');
  if (outcome !== null && (outcome as StandbyOutcome).kind === 'took_over') (outcome as Extract<StandbyOutcome, { kind: 'took_over' }>).holder.stop();
});

test('a holder whose renewal finds the revision moved steps down at once', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const holder = await acquire(kv, clock, 'driver-a');
  const e = (await kv.get())!;
  await kv.update({ ...e.record!, holder: 'driver-z', incarnation: 'driver-z#1', term: 2 }, e.revision);
  const writes = kv.writes.length;
  await advance(clock, 600);
  assert.ok(holder.lost instanceof LeaseLostError);
  assert.match(holder.lost!.message, /took over/);
  assert.equal(kv.writes.length, writes, 'the failed compare-and-set wrote nothing');
});

test('a holder held up past its lease with nobody taking over checks the revision, then renews and stays the holder', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const holder = await acquire(kv, clock, 'driver-a');
  const revision = (await kv.get())!.revision;
  // One long stall: the clock jumps, and the renewal timer fires once, late.
  holder.stop();
  clock.increment(LEASE * 2);
  await holder.renew();
  assert.equal(holder.held, true);
  assert.equal(holder.lost, null);
  assert.ok((await kv.get())!.revision > revision, 'renewed after the stall');
  holder.stop();
});

test('a second driver is refused while the lease is renewed, and takes a lease left by a crashed driver after lease_ms', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const a = await acquire(kv, clock, 'driver-a');
  await assert.rejects(acquire(kv, clock, 'driver-b'), (e: unknown) => {
    assert.ok(e instanceof LeaseHeldError);
    assert.match((e as Error).message, /job j already has an active scheduler: driver-a \(run run-1, term 1/);
    assert.match((e as Error).message, /--standby/);
    return true;
  });
  a.stop(); // crashed, no release
  const started = clock.monotonic();
  const b = await acquire(kv, clock, 'driver-b');
  assert.ok(clock.monotonic() - started >= LEASE - 600, 'waited for the lease to run out');
  assert.equal(b.term, 2);
  await b.release('job done');
  assert.equal((await kv.get())!.record!.state, 'released');
  // A released lease is taken at once.
  const t0 = clock.monotonic();
  const c = await acquire(kv, clock, 'driver-c');
  assert.ok(clock.monotonic() - t0 <= 50);
  assert.equal(c.term, 3);
  c.stop();
});

test('a standby ignores a release it finds at start (an earlier run), follows the next holder and ends when that one releases', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const old = await acquire(kv, clock, 'driver-old');
  await old.release('earlier run done');
  const standby = new LeaseStandby({ kv, clock, identity: id('driver-b') });
  let outcome: StandbyOutcome | null = null;
  void standby.wait().then((o) => { outcome = o; });
  await advance(clock, 5_000);
  assert.equal(outcome, null, 'a release seen before any holder is not this job ending');
  const a = await acquire(kv, clock, 'driver-a');
  await advance(clock, 3_000);
  assert.equal(outcome, null);
  await a.release('the job is done');
  await advance(clock, 500);
  const o = outcome as StandbyOutcome | null;
  assert.equal(o?.kind, 'ended');
  if (o?.kind === 'ended') {
    assert.equal(o.record.holder, 'driver-a');
    assert.equal(o.record.reason, 'the job is done');
  }
});

test('two standbys: exactly one takes over, the other watches the new holder', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  const a = await acquire(kv, clock, 'driver-a');
  const outcomes: (StandbyOutcome | null)[] = [null, null];
  const standbys = ['driver-b', 'driver-c'].map((h) => new LeaseStandby({ kv, clock, identity: id(h) }));
  standbys.forEach((s, i) => { void s.wait().then((o) => { outcomes[i] = o; }); });
  await advance(clock, 500);
  a.stop();
  await advance(clock, LEASE + 1_000);
  const took = outcomes.filter((o) => o?.kind === 'took_over');
  assert.equal(took.length, 1, JSON.stringify(outcomes.map((o) => o?.kind ?? null)));
  await advance(clock, 5_000);
  assert.equal(outcomes.filter((o) => o?.kind === 'took_over').length, 1, 'the winner renews: no second takeover');
  for (const s of standbys) s.stop();
  for (const o of outcomes) if (o?.kind === 'took_over') o.holder.stop();
  assert.equal(new Set(kv.writes.filter((w) => w.term === 2).map((w) => w.holder)).size, 1);
});

test('a driver whose lease write landed but whose answer was lost takes the lease as its own, without waiting it out', async () => {
  const clock = new SimulatedClock(1_000_000);
  const kv = new RecordingKv();
  let lostAnswers = 1;
  const flaky: LeaseKv = {
    get: () => kv.get(),
    update: (r, rev) => kv.update(r, rev),
    async create(r) {
      const rev = await kv.create(r);
      if (lostAnswers-- > 0) throw new Error('TIMEOUT'); // written, but the caller never hears so
      return rev;
    },
  };
  const t0 = clock.monotonic();
  const a = await acquire(flaky, clock, 'driver-a');
  assert.ok(clock.monotonic() - t0 < 1_000, `took ${clock.monotonic() - t0} ms`);
  assert.equal(a.term, 1);
  assert.equal(kv.writes.length, 1, 'one write');
  await advance(clock, 600);
  assert.ok(a.held && a.renewals >= 1, 'and renews it');
  a.stop();
});
