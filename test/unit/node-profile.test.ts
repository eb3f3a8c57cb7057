/** A node's profile on the in-process bus: network measured and labelled, emulation applied and labelled. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, Transport } from '../../runtime/mod.ts';
import { measureNetwork, measureNodeProfile } from '../../actors/node/node-profile.ts';
import { parseNodeProfiles } from '../../topology/grouping.ts';

const device = {
  node: 'n1', matmul_gflops: 100, gather_rows_per_s: 2_000_000, memory_gb: 32, cpus: 8, providers: ['cpu' as const], variance: 0.03,
};

function transport(broker = new InProcessBroker()) {
  return new Transport(broker.client(), { clientId: 'probe-n1' });
}

/** Holds the round trips of `t` for which `held(n)` (n: 0, 1, … in order) is true `ms` after their reply. */
function holdRequests(t: Transport, held: (n: number) => boolean, ms: number): { count: () => number } {
  const request = t.request.bind(t);
  let n = 0;
  t.request = (async (...a: Parameters<typeof t.request>) => {
    const r = await request(...a);
    if (held(n++)) await new Promise((res) => setTimeout(res, ms));
    return r;
  }) as typeof t.request;
  return { count: () => n };
}

test('network probe on the in-process bus: rtt ≥ 0, bandwidth > 0, labelled embedded', async () => {
  const t = transport();
  const net = await measureNetwork(t, { rttSamples: 5, bandwidthBytes: 1024 * 1024 });
  assert.equal(net.link, 'embedded');
  assert.ok(net.rtt_ms >= 0 && Number.isFinite(net.rtt_ms));
  assert.ok(net.bandwidth_mbps > 0 && Number.isFinite(net.bandwidth_mbps));
  await t.close();
});

test('rtt is the least round trip: a probe whose round trips mostly wait behind 40 ms of other traffic still reports the quick ones', async () => {
  const t = transport();
  // The warm-up and 4 of the 7 samples held 40 ms (queueing behind other traffic): their median is a held one.
  const requests = holdRequests(t, (n) => n % 3 !== 1, 40);
  const net = await measureNetwork(t, { rttSamples: 7, bandwidthBytes: 256 * 1024, timeoutMs: 5_000 });
  assert.equal(requests.count(), 8, 'the warm-up and 7 samples');
  assert.ok(net.rtt_ms < 20, `rtt ${net.rtt_ms} ms: the quick round trips, not the held ones`);
  await t.close();
});

test('rounds: the least round trip and the most bandwidth of any round count, so one round in a busy moment does not decide', async () => {
  // The first round's round trips and bandwidth messages are held 40 ms each (the node's link or cores busy), the later ones are not.
  const held = (rounds: number) => {
    const t = transport();
    const publish = t.publish.bind(t);
    let bw = 0;
    holdRequests(t, (n) => n < 4, 40); // the first round: a warm-up and 3 samples
    t.publish = ((subject: string, data: Uint8Array, opts?: Parameters<typeof t.publish>[2]) => {
      // The first round's 5 bandwidth messages (one untimed, four timed), each held 40 ms on its way out.
      if (subject.endsWith('.bandwidth') && bw++ < 5) { setTimeout(() => publish(subject, data, opts), 40); return; }
      publish(subject, data, opts);
    }) as typeof t.publish;
    return { t, probe: measureNetwork(t, { rttSamples: 3, bandwidthBytes: 1024 * 1024, messageBytes: 256 * 1024, timeoutMs: 5_000, rounds, roundGapMs: 20, random: () => 0.5 }) };
  };
  const one = held(1);
  const busy = await one.probe;
  await one.t.close();
  // A 40 ms timer can fire a fraction of a millisecond early (39.6 ms seen): a held round trip is well over 30.
  assert.ok(busy.rtt_ms >= 30, `one round, all of it held: rtt ${busy.rtt_ms} ms`);
  const three = held(3);
  const net = await three.probe;
  await three.t.close();
  assert.ok(net.rtt_ms < 20, `three rounds: rtt ${net.rtt_ms} ms is a quick round's`);
  assert.ok(net.bandwidth_mbps > 4 * busy.bandwidth_mbps, `three rounds: ${net.bandwidth_mbps} Mbit/s against ${busy.bandwidth_mbps} held`);
  const t = transport();
  await assert.rejects(measureNetwork(t, { rounds: 0 }), /rounds must be an integer ≥ 1, got 0/);
  await t.close();
});

test('roundsWithinMs: a later round measures bandwidth only while the probe so far and one more round fit (a slow link measures it once), and round trips in every round', async () => {
  const run = async (roundsWithinMs: number) => {
    const t = transport();
    // The first round's round trips held 30 ms each: that round (a warm-up and 3 samples) takes ≥ 120 ms.
    const requests = holdRequests(t, (n) => n < 4, 30);
    const publish = t.publish.bind(t);
    let bandwidthMessages = 0;
    t.publish = ((subject: string, data: Uint8Array, opts?: Parameters<typeof t.publish>[2]) => {
      if (subject.endsWith('.bandwidth')) bandwidthMessages++;
      publish(subject, data, opts);
    }) as typeof t.publish;
    // 256 KiB of 256 KiB messages: two a round (one untimed, one timed).
    const net = await measureNetwork(t, { rttSamples: 3, bandwidthBytes: 256 * 1024, timeoutMs: 5_000, rounds: 3, roundGapMs: 10, random: () => 0.5, roundsWithinMs });
    await t.close();
    return { bandwidthRounds: bandwidthMessages / 2, roundTripRounds: requests.count() / 4, net };
  };
  const slow = await run(100);
  assert.equal(slow.bandwidthRounds, 1, 'rounds of ≥ 120 ms within 100 ms: bandwidth in the first only');
  assert.equal(slow.roundTripRounds, 3, 'round trips in all three');
  assert.ok(slow.net.rtt_ms < 20, `rtt ${slow.net.rtt_ms} ms: a later round's quick round trips, not the first round's held ones`);
  assert.ok(slow.net.bandwidth_mbps > 0 && Number.isFinite(slow.net.bandwidth_mbps), 'the first round\'s bandwidth stands');
  const quick = await run(10_000);
  assert.equal(quick.bandwidthRounds, 3);
  assert.equal(quick.roundTripRounds, 3);
});

test('messages larger than max_payload are chunked by the transport and still counted', async () => {
  const t = transport(new InProcessBroker(64 * 1024));
  const net = await measureNetwork(t, { rttSamples: 3, bandwidthBytes: 1024 * 1024, messageBytes: 256 * 1024 });
  assert.ok(net.bandwidth_mbps > 0);
  assert.ok(t.stats.chunksSent >= 4 * 5, `256 KiB messages split, ${t.stats.chunksSent} chunks`);
  await t.close();
});

test('measureNodeProfile: device profile plus network, a valid NodeProfile, not emulated', async () => {
  const t = transport();
  const p = await measureNodeProfile({ transport: t, node: 'n1', device, network: { rttSamples: 3, bandwidthBytes: 512 * 1024 } });
  assert.equal(p.emulated, false);
  assert.equal(p.link, 'embedded');
  assert.equal(p.matmul_gflops, 100);
  assert.equal(p.step_ms_variance, null);
  assert.deepEqual(parseNodeProfiles([p], 'measured'), [p], 'what it measures passes the profile file checks');
  await t.close();
});

test('emulate.speed scales compute, emulate.bandwidth_mbps replaces bandwidth, and the profile says emulated', async () => {
  const t = transport();
  const p = await measureNodeProfile({
    transport: t, node: 'n1', device, emulate: { speed: 0.25, bandwidth_mbps: 100 , link: 'hold' }, network: { rttSamples: 3, bandwidthBytes: 512 * 1024 },
  });
  assert.equal(p.matmul_gflops, 25);
  assert.equal(p.gather_rows_per_s, 500_000);
  assert.equal(p.bandwidth_mbps, 100);
  assert.equal(p.emulated, true);
  assert.equal(p.link, 'emulated');
  const speedOnly = await measureNodeProfile({ transport: t, node: 'n1', device, emulate: { speed: 0.5, bandwidth_mbps: null , link: 'hold' }, network: { rttSamples: 3, bandwidthBytes: 512 * 1024 } });
  assert.equal(speedOnly.emulated, true);
  assert.notEqual(speedOnly.bandwidth_mbps, 100);
  assert.equal(speedOnly.link, 'embedded', 'bandwidth still measured in-process');
  await t.close();
});
