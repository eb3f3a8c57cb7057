/**
 * communication.compression adaptive over a real rate-limited link, with no
 * emulated bandwidth: w1 runs in a network-lab namespace (deploy/netlab.ts)
 * whose veth link is held to 2 Mbit/s by tc tbf; the servers and the other
 * workers run on the host over loopback. A worker without an emulated link
 * counts the bytes it sends and receives at the bandwidth its profile
 * measured when it joined (actors/worker/link-usage.ts):
 *
 * - w1's profile measures its link at a few Mbit/s, and its pulls and
 *   pushes keep the link busy: it switches its gradients to fp16, saying so
 *   once in its log and in its progress telemetry;
 * - the host workers (compute emulated at 100 ms a step, requests over
 *   loopback at hundreds of Mbit/s) measure their links as mostly idle and
 *   keep float32, though they wait on the shards (processes on a shared
 *   machine) a good part of each step: counted as link time, as before the
 *   bandwidth was measured, those waits made them switch too;
 * - w1 joins and trains over its slow link (its profile's bandwidth probe
 *   keeps two messages in flight: a burst of the whole probe once queued
 *   seconds of data ahead of the client's pings, and its connection was
 *   dropped as stale);
 * - the job ends with every batch acknowledged exactly once.
 *
 * Needs root and iproute2 (CI runs as root); where the lab cannot run the
 * test fails with the reason rather than skip.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFile, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { ChildProcess } from 'node:child_process';
import { connectTransport } from '../../runtime/mod.ts';
import { subscribeTelemetry, type ProgressTelemetry } from '../../actors/monitor/telemetry.ts';
import { explainExit, hetps, watchAcks, writeJobConfig, type Child } from '../support/ps.ts';
import { labAndClusterForFile, launchWithW1InLab } from '../support/lab.ts';

const LINK_MBPS = 2;

const fx = labAndClusterForFile({ prefix: 'hetps-adaptive-link-', lab: 'adlink', natsNodes: 1 });

const SWITCH = /node (w\d): link utilisation (0\.\d\d|1\.00) > compression_threshold 0\.5: gradients now sent as fp16/;

test('adaptive compression on a real 2 Mbit/s link (tc tbf, no emulated bandwidth): the worker behind it measures its link from its profiled bandwidth, switches to fp16 and says so; workers on loopback keep float32; every batch acknowledged once', { timeout: 300_000 }, async (t) => {
  const cluster = fx.cluster();
  const lab = fx.lab();
  const dir = fx.dir();
  const job = 'adlink';
  const urls = cluster.urls;
  // ~150 batches: the host workers take ~25 s for them, so w1 pushes 4 times or so over its slow link
  // (with 50, the job ended after w1's first or second push, and in 3 of 5 runs today before it had switched).
  const cfg = await writeJobConfig(dir, { job, mode: 'asp', servers: urls, runDir: join(dir, 'runs'), samples: 4800, epochs: 1, workerRecoveryTimeoutS: 60, compression: 'adaptive' });
  // The host workers' compute emulated at 100 ms a step, so their loopback requests are a small part of their time.
  await appendFile(cfg, 'nodes:\n  w2: { emulate: { speed: 1 } }\n  w3: { emulate: { speed: 1 } }\n  w4: { emulate: { speed: 1 } }\n');
  const watch = await watchAcks(urls, job);
  const tel = await connectTransport({ servers: urls, name: 'progress-watcher' });
  const progress: ProgressTelemetry[] = [];
  const stopTel = subscribeTelemetry(tel, job, { progress: (p) => { progress.push(p); } });
  await tel.flush();
  const children: Child[] = [];
  let w1: ChildProcess | null = null;
  try {
    const launched = await launchWithW1InLab(fx, { cfg, job, children, w1Mbps: LINK_MBPS, readyMs: 120_000 });
    w1 = launched.w1;
    const { w1Out, others } = launched;
    const summaryFile = join(dir, 'summary.json');
    const driver = hetps(['up', '--config', cfg, '--no-launch', '--summary', summaryFile], { timeoutMs: 290_000 });
    children.push(driver);
    const ended = await Promise.race([driver.exited, sleep(240_000, null, { ref: false })]);
    assert.ok(ended !== null, `the job did not end within 240 s; acks ${JSON.stringify(Object.fromEntries(watch.byNode))}\n--- driver:\n${driver.stderr().slice(-3000)}\n--- w1:\n${w1Out().slice(-3000)}`);
    assert.equal(ended.code, 0, explainExit(ended));
    // The last progress messages are published as the workers stop; give them a moment to arrive.
    await sleep(500);

    const w1Switches = w1Out().split('\n').filter((l) => SWITCH.test(l));
    assert.equal(w1Switches.length, 1, `w1 switched to fp16 once and said so:\n${w1Out().split('\n').filter((l) => /compression|utilisation/.test(l)).join('\n') || w1Out().slice(-3000)}`);
    assert.match(w1Switches[0]!, /"measured_by":"bytes over the measured bandwidth"/, 'measured from its bytes at its profiled bandwidth: no emulated link');
    const profiled = /"bandwidth_mbps":([\d.]+)[^\n]*profiled w1/.exec(w1Out());
    assert.ok(profiled !== null && Number(profiled[1]) < 4 * LINK_MBPS, `w1's profile measured its rate-limited link: ${profiled?.[1]} Mbit/s`);
    assert.doesNotMatch(w1Out(), /disconnected from NATS/, 'w1 kept its connection');
    assert.doesNotMatch(w1Out(), /gradients now sent as float32/, 'and stayed on fp16');
    const w1Progress = progress.filter((p) => p.node === 'w1');
    assert.ok(w1Progress.some((p) => p.compression === 'fp16' && p.link_utilisation !== null && p.link_utilisation > 0.5),
      `w1's progress telemetry reports fp16 at a utilisation above 0.5: ${JSON.stringify(w1Progress.map((p) => [p.compression, p.link_utilisation]))}`);
    for (const [i, w] of others.entries()) {
      const node = `w${i + 2}`;
      assert.doesNotMatch(w.stderr(), /gradients now sent as fp16/, `${node} on loopback kept float32`);
      const mine = progress.filter((p) => p.node === node && p.link_utilisation !== null);
      assert.ok(mine.every((p) => p.compression === 'none' && p.link_utilisation! <= 0.5), `${node}: ${JSON.stringify(mine.map((p) => [p.compression, p.link_utilisation]))}`);
    }
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as { batches: number; batches_acked: number; duplicate_acks: number };
    assert.ok((watch.byNode.get('w1') ?? 0) > 0, `w1 trained: ${JSON.stringify(Object.fromEntries(watch.byNode))}`);
    assert.equal(s.batches_acked, s.batches);
    assert.equal(s.duplicate_acks, 0);
    assert.deepEqual([...watch.acks.entries()].filter(([, n]) => n !== 1), [], 'every batch acknowledged exactly once');
    assert.equal(watch.acks.size, s.batches);
    const u = w1Progress.map((p) => p.link_utilisation).filter((x): x is number => x !== null);
    t.diagnostic(`w1 (profiled at ${profiled![1]} Mbit/s) acknowledged ${watch.byNode.get('w1')} of ${s.batches} batches; its link utilisation ${u.map((x) => x.toFixed(2)).join(', ')}`);
  } finally {
    stopTel();
    await tel.close();
    await watch.close();
    try { w1?.kill('SIGKILL'); } catch { /* gone */ }
    for (const c of children) c.kill('SIGKILL');
  }
});
