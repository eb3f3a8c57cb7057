/**
 * A node profiles itself when it joins, before any driver exists: a
 * `hetps launch --role worker --node NAME` process on a real 3-node NATS
 * cluster publishes its profile on `hps.<job>.tel.profile.<node>` and puts
 * it in the job's profile bucket, where a driver started later finds it; a
 * server publishes its own once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { connectTransport, decode, telemetryWildcard, type Transport } from '../../runtime/mod.ts';
import { natsConnectionOf } from '../../actors/store/plan-store.ts';
import { natsProfileStore } from '../../actors/store/profile-store.ts';
import { profileTelemetrySchema, type ProfileTelemetry } from '../../actors/monitor/telemetry.ts';
import { withCluster } from '../support/cluster.ts';
import { hetps, tempDirForFile, type Child } from '../support/ps.ts';

const tempDir = tempDirForFile('hetps-profile-');

/**
 * Launches `hetps launch <args>` with no driver and calls `check` with the
 * profile messages seen once the first one arrived (and the watcher, and the
 * node's process); the node is stopped afterwards.
 */
async function withFirstProfile(
  urls: string[], job: string, args: string[],
  check: (seen: { subject: string; body: unknown }[], watcher: Transport, child: Child) => Promise<void>,
): Promise<void> {
  const watcher = await connectTransport({ servers: urls, name: `profile-watcher-${job}` });
  const seen: { subject: string; body: unknown }[] = [];
  const sub = watcher.subscribe(telemetryWildcard(job, 'profile'), (m) => seen.push({ subject: m.subject, body: decode(m.data) }));
  await watcher.flush();
  const child = hetps(['launch', ...args, '--nats', urls.join(','), '--wait', '30'], { timeoutMs: 50_000 });
  try {
    const deadline = Date.now() + 40_000;
    while (seen.length === 0) {
      if (Date.now() > deadline || child.child.exitCode !== null) assert.fail(`no profile message; node output:\n${child.stderr().slice(-3000)}`);
      await new Promise((r) => setTimeout(r, 50));
    }
    await check(seen, watcher, child);
  } finally {
    child.kill('SIGTERM');
    await child.exited;
    sub.unsubscribe();
    await watcher.close();
  }
}

test('a joining worker publishes its measured profile (rtt, bandwidth, compute, emulation labelled) and stores it for the driver', { timeout: 60_000 }, async () => {
  await withCluster(async (nats) => {
    const job = `prof${process.pid}`;
    const cfg = join(tempDir(), 'profile.yaml');
    await writeFile(cfg, `job: { name: ${job}, run_dir: ${JSON.stringify(join(tempDir(), 'runs'))} }
cluster:
  worker_nodes: [w1, w2]
  profiling: { probe_seconds: 0.3 }
  server_nodes: [s1]
nodes:
  w2: { emulate: { speed: 0.5 } }
model:
  type: ctr
  ctr: { embedding_dim: 8, hidden: [16], pooling: mean, wide: true, hash_buckets: 4096 }
data: { source: spam, batch_size: 32, epochs: 1, samples: 64, test_fraction: 0.2, vocab_size: 4096, max_tokens: 64 }
training: { mode: hps }
`);
    // No driver: the worker waits for the job after it has profiled itself.
    await withFirstProfile(nats.urls, job, ['--role', 'worker', '--config', cfg, '--node', 'w2'], async (seen, watcher, worker) => {
      assert.equal(seen[0]!.subject, `hps.${job}.tel.profile.w2`);
      const t: ProfileTelemetry = profileTelemetrySchema.parse(seen[0]!.body);
      assert.equal(t.node, 'w2');
      assert.equal(t.phase, 'join');
      assert.equal(t.link, 'nats', 'the network was measured to the NATS server');
      assert.ok(t.rtt_ms > 0 && t.rtt_ms < 1_000, `rtt_ms ${t.rtt_ms}`);
      assert.ok(t.bandwidth_mbps > 0, `bandwidth_mbps ${t.bandwidth_mbps}`);
      assert.ok(t.matmul_gflops > 0 && t.gather_rows_per_s > 0);
      assert.equal(t.emulated, true, 'emulate.speed 0.5 is labelled');
      assert.equal(t.device_from, 'node');
      assert.equal(t.network_from, 'node');
      assert.equal(t.step_ms_variance, null, 'no steps yet');
      assert.ok(t.probe_ms < 5_000, `probe took ${t.probe_ms} ms`);
      // What a driver starting now would read.
      const stored = await natsProfileStore(natsConnectionOf(watcher)!, job).getMany(['w1', 'w2']);
      assert.deepEqual([...stored.keys()], ['w2']);
      assert.deepEqual(stored.get('w2'), t);
      assert.match(worker.stderr(), /profiled w2 in \d+ ms \(EMULATED/);
    });
  });
});

test('a joining server publishes its profile too (once: it has no steps to time)', { timeout: 60_000 }, async () => {
  await withCluster(async (nats) => {
    const job = `profs${process.pid}`;
    const cfg = join(tempDir(), 'profile-server.yaml');
    await writeFile(cfg, `job: { name: ${job}, run_dir: ${JSON.stringify(join(tempDir(), 'runs-s'))} }
cluster:
  worker_nodes: [w1]
  profiling: { probe_seconds: 0.3 }
  server_nodes: [s1]
model: { type: ctr, ctr: { embedding_dim: 8, hidden: [16], pooling: mean, wide: true, hash_buckets: 4096 } }
data: { source: spam, batch_size: 32, epochs: 1, samples: 64, test_fraction: 0.2, vocab_size: 4096, max_tokens: 64 }
training: { mode: hps }
`);
    // No driver: the server profiles itself, then waits for the shard plan.
    await withFirstProfile(nats.urls, job, ['--role', 'server', '--config', cfg, '--server-id', 's1'], async (seen) => {
      assert.equal(seen[0]!.subject, `hps.${job}.tel.profile.s1`);
      const t: ProfileTelemetry = profileTelemetrySchema.parse(seen[0]!.body);
      assert.equal(t.node, 's1');
      assert.equal(t.phase, 'join');
      assert.ok(t.rtt_ms > 0 && t.bandwidth_mbps > 0 && t.matmul_gflops > 0);
      assert.equal(t.emulated, false);
      await new Promise((r) => setTimeout(r, 1_000));
      assert.equal(seen.length, 1, 'published once');
    });
  });
});
