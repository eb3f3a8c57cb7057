/**
 * `nodes.<name>.emulate.link: tc`: `hetps up` starts the node in a network
 * namespace of the network lab (deploy/netlab.ts) on a veth link held to
 * `bandwidth_mbps` by tc tbf, instead of the node holding its own transfers.
 * The node's process really runs in another network namespace, its profile
 * measures its own limited link (the other workers take this machine's,
 * measured over loopback), it holds nothing itself, the asp job
 * acknowledges every batch once, and the namespace is gone after the run.
 * Where tc links cannot work, hetps up refuses before starting anything,
 * naming the setting.
 *
 * Needs root and iproute2 (CI runs as root); where the lab cannot run the
 * test fails with the reason rather than skip.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { appendFile, readFile, readlink } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { explainExit, hetps, tempDirForFile, writeJobConfig, type LossSummary } from '../support/ps.ts';
import { NetLab } from '../../deploy/netlab.ts';

const dir = tempDirForFile('hetps-up-tc-');
const MBPS = 4;

test('emulate.link tc: hetps up runs w1 in its own network namespace behind a real 4 Mbit/s tc limit; w1 measures that link, holds nothing itself, every batch is acknowledged once and the namespace is removed', { timeout: 200_000 }, async (t) => {
  const lab = await NetLab.available();
  assert.ok(lab.ok, `the network lab cannot run here: ${lab.ok ? '' : lab.reason}`);
  const job = 'uptc';
  const cfg = await writeJobConfig(dir(), { job, mode: 'asp', servers: null, runDir: join(dir(), 'runs'), samples: 640, epochs: 1, workerRecoveryTimeoutS: 30 });
  await appendFile(cfg, `nodes:\n  w1: { emulate: { speed: 1, bandwidth_mbps: ${MBPS}, link: tc } }\n`);
  const summaryFile = join(dir(), 'summary.json');
  const driver = hetps(['up', '--config', cfg, '--summary', summaryFile], { timeoutMs: 190_000 });
  try {
    // While it trains: w1's process (the driver names its group rank and config) is in another network namespace.
    const deadline = Date.now() + 120_000;
    let w1Ns: string | null = null;
    while (w1Ns === null) {
      assert.ok(Date.now() < deadline && driver.child.exitCode === null, `w1 never started:\n${driver.stdout().slice(-3000)}\n${driver.stderr().slice(-3000)}`);
      try {
        const pid = Number(execFileSync('pgrep', ['-f', `launch --role worker --group g1 --node-rank 0 .*${cfg}`]).toString().trim().split('\n')[0]);
        w1Ns = await readlink(`/proc/${pid}/ns/net`);
      } catch { await sleep(100); }
    }
    assert.notEqual(w1Ns, await readlink('/proc/self/ns/net'), 'w1 runs in a network namespace of its own');

    const r = await driver.exited;
    assert.equal(r.code, 0, explainExit(r));
    const line = /tc links: w1 4 Mbit\/s \(netns (hetps-[\w-]+)\)/.exec(r.stderr);
    assert.ok(line !== null, `the driver says which node is on which tc link:\n${r.stderr.slice(0, 4000)}`);
    const s = JSON.parse(await readFile(summaryFile, 'utf8')) as LossSummary;
    assert.equal(s.batches_acked, s.batches, 'every batch acknowledged');
    assert.equal(s.duplicate_acks, 0);
    assert.equal(s.integrity?.lost, 0);
    assert.equal(s.integrity?.duplicated, 0);

    // w1 measured its own link through the limit; w2 has this machine's loopback profile.
    const logs = join(runDirOf(r.stdout), 'logs');
    const w1Log = await readFile(join(logs, 'w1.log'), 'utf8');
    const w2Log = await readFile(join(logs, 'w2.log'), 'utf8');
    const bw = (log: string, node: string) => {
      const m = new RegExp(`"bandwidth_mbps":([\\d.]+)[^\\n]*"link":"(\\w+)"[^\\n]*(?:profiled|profile of) ${node}`).exec(log);
      assert.ok(m !== null, `${node}'s profile line:\n${log.slice(0, 3000)}`);
      return { mbps: Number(m[1]), link: m[2] };
    };
    const w1 = bw(w1Log, 'w1');
    const w2 = bw(w2Log, 'w2');
    t.diagnostic(`profiled bandwidth: w1 ${w1.mbps} Mbit/s over its tc link, w2 ${w2.mbps} Mbit/s (this machine's loopback)`);
    assert.equal(w1.link, 'nats', 'a tc link is a real one, measured like any other (not "emulated")');
    assert.ok(w1.mbps < 2 * MBPS, `w1 measured its ${MBPS} Mbit/s link: ${w1.mbps}`);
    assert.ok(w2.mbps > 10 * MBPS, `w2 on loopback: ${w2.mbps}`);
    assert.doesNotMatch(w1Log, /EMULATED link/, 'w1 holds no transfers itself: the kernel limits its link');

    assert.doesNotMatch(execFileSync('ip', ['netns', 'list']).toString(), new RegExp(`\\b${line[1]}\\b`), 'the namespace is removed after the run');
  } finally {
    driver.kill('SIGKILL');
  }
});

/** The run's directory, from the driver's last line (`summary: <run dir>/summary.json`). */
function runDirOf(stdout: string): string {
  const m = /summary: (\S+)\/summary\.json/.exec(stdout);
  assert.ok(m !== null, `the driver names its summary:\n${stdout.slice(-2000)}`);
  return m[1]!;
}

test('emulate.link tc where it cannot work: embedded, or with nats.servers, hetps up refuses before starting anything and names the setting', { timeout: 60_000 }, async () => {
  const cfg = await writeJobConfig(dir(), { job: 'uptcbad', mode: 'asp', servers: null, runDir: join(dir(), 'runs-bad'), samples: 320, epochs: 1, workerRecoveryTimeoutS: 30 });
  await appendFile(cfg, `nodes:\n  w3: { emulate: { bandwidth_mbps: 2, link: tc } }\n`);
  const embedded = await hetps(['up', '--config', cfg, '--embedded'], { timeoutMs: 50_000 }).exited;
  assert.notEqual(embedded.code, 0);
  assert.match(embedded.stderr, /nodes\.w3\.emulate\.link: tc \(w3\) limits a node's own network link, and embedded every node runs in this one process/);

  const given = await writeJobConfig(dir(), { job: 'uptcgiven', mode: 'asp', servers: ['nats://127.0.0.1:1'], runDir: join(dir(), 'runs-given'), samples: 320, epochs: 1, workerRecoveryTimeoutS: 30 });
  await appendFile(given, `nodes:\n  w3: { emulate: { bandwidth_mbps: 2, link: tc } }\n`);
  const withServers = await hetps(['up', '--config', given], { timeoutMs: 50_000 }).exited;
  assert.notEqual(withServers.code, 0);
  assert.match(withServers.stderr, /nodes\.w3\.emulate\.link: tc \(w3\) needs the local NATS cluster hetps up starts/);
});
