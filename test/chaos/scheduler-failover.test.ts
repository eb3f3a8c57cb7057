/**
 * Scheduler failover: the quick start over a real 3-node NATS cluster, its
 * nodes started by the test, an active driver (`hetps up --no-launch`) and a
 * standby (`hetps up --standby --no-launch`). The active driver is
 * SIGKILLed after 30 % of the batches. The standby answers `ctl.status`
 * (a plain nats.js JSON request) within 5 s of the kill; acknowledgements
 * never stop for 5 s or more (the largest gap is reported); every node
 * process keeps running through the takeover and stops at the job's end on
 * the standby's shutdown; the standby's summary has every batch
 * acknowledged exactly once, the integrity check with nothing lost or
 * applied twice, and the takeover.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { connect, headers } from '@nats-io/transport-node';
import { decode } from '@msgpack/msgpack';
import { assertNothingLost, clusterAndDirForFile, explainExit, hetps, launchQuickstartNodes, ROOT, type Child, QUICKSTART_NODES } from '../support/ps.ts';
import { until } from '../support/until.ts';

const env = clusterAndDirForFile('hetps-scheduler-failover-');

interface Summary {
  batches: number; batches_acked: number; duplicate_acks: number; test_auc: number;
  integrity: { acked: number; applied: number; lost: number; duplicated: number; replicas_equal: boolean | null } | null;
  scheduler: { lease_ms: number; holder: string; takeovers: { at: string; from: string; to: string; lease_gap_ms: number; term: number }[]; acks_seen_from: string };
}

test('quick start: the active driver SIGKILLed at 30 % is replaced by the standby within 5 s, training never stops, every batch acknowledged once', { timeout: 600_000 }, async (t) => {
  const job = 'schedfail';
  const quick = await readFile(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8');
  const cfg = join(env.dir(), `${job}.yaml`);
  await writeFile(cfg, quick.replace('name: quickstart', `name: ${job}\n  run_dir: ${join(env.dir(), 'runs')}`)
    + `\nnats:\n  servers: [${env.nats().urls.join(', ')}]\n`);

  // The test's own view, with no hetps code: acknowledgements as the workers report them, and ctl.status.
  const nc = await connect({ servers: env.nats().urls, name: 'scheduler-failover-watch' });
  const ackTimes: number[] = [];
  const acks = new Map<string, number>();
  nc.subscribe(`hps.${job}.tel.batch.*`, {
    callback: (_e, m) => {
      const b = decode(m.data) as { batch_id: string; ack_confirmed: boolean };
      if (!b.ack_confirmed) return;
      ackTimes.push(Date.now());
      acks.set(b.batch_id, (acks.get(b.batch_id) ?? 0) + 1);
    },
  });
  await nc.flush();
  const jsonHeaders = headers();
  jsonHeaders.set('Content-Type', 'application/json');
  const status = async (): Promise<{ state: string; progress: { batches_acked: number } } | null> => {
    try {
      const m = await nc.request(`hps.${job}.ctl.status`, new TextEncoder().encode('{}'), { timeout: 500, headers: jsonHeaders });
      const r = JSON.parse(new TextDecoder().decode(m.data)) as { type: string; result?: { state: string; progress: { batches_acked: number } } };
      return r.type === 'reply' ? r.result! : null;
    } catch {
      return null; // no responders (no scheduler yet) or no answer in time
    }
  };

  const nodes: Child[] = [];
  const drivers: Child[] = [];
  try {
    nodes.push(...launchQuickstartNodes(cfg));
    const activeSummary = join(env.dir(), 'active-summary.json');
    const standbySummary = join(env.dir(), 'standby-summary.json');
    // The standby first, so it counts every acknowledgement of the run; then the driver that creates the job.
    const standby = hetps(['up', '--standby', '--config', cfg, '--no-launch', '--summary', standbySummary], { timeoutMs: 400_000 });
    drivers.push(standby);
    await until(() => /acknowledgements are counted from now/.test(standby.stderr()), 'the standby listening', 120_000, () => standby.stderr().slice(-3000));
    const active = hetps(['up', '--config', cfg, '--no-launch', '--summary', activeSummary], { timeoutMs: 400_000 });
    drivers.push(active);

    const total = 292; // the quick start's batches (2 epochs)
    await until(() => acks.size >= Math.round(total * 0.3), '30% acknowledged', 240_000,
      () => `active:\n${active.stderr().slice(-4000)}\nstandby:\n${standby.stderr().slice(-2000)}`);
    assert.match(standby.stderr(), /standing by/, 'the standby is waiting on the lease');
    const before = acks.size;
    active.child.kill('SIGKILL');
    const killedAt = Date.now();
    t.diagnostic(`active driver SIGKILLed at ${before} acknowledged batches`);

    // The new scheduler: the first ctl.status answer after the kill.
    let firstAnswer: number | null = null;
    let attachedAt: number | null = null;
    while (attachedAt === null && Date.now() - killedAt < 60_000) {
      const s = await status();
      if (s !== null) {
        firstAnswer ??= Date.now();
        if (s.state !== 'starting') attachedAt = Date.now();
      }
      if (attachedAt === null) await sleep(50);
    }
    assert.ok(firstAnswer !== null, `no ctl.status answer within 60 s of the kill:\n${standby.stderr().slice(-3000)}`);
    const takeoverMs = firstAnswer - killedAt;
    t.diagnostic(`first ctl.status answer from the new scheduler ${takeoverMs} ms after the kill; attached to the job after ${(attachedAt ?? NaN) - killedAt} ms`);
    assert.ok(takeoverMs < 5_000, `takeover took ${takeoverMs} ms`);
    for (const n of nodes) assert.equal(n.child.exitCode, null, 'every node process kept running');

    const r = await standby.exited;
    // The nodes' output too: once (a full suite) the last 3 batches stayed unacknowledged with every worker running.
    assert.equal(r.code, 0, `${explainExit(r)}\n${nodes.map((n, i) => `--- ${QUICKSTART_NODES[i]!.name}:\n${n.stderr().slice(-2500)}`).join('\n')}`);
    const a = await active.exited;
    assert.equal(a.signal, 'SIGKILL');
    assert.ok(!existsSync(activeSummary), 'the killed driver wrote no summary');

    // Every node stops on the standby's shutdown.
    for (const n of nodes) {
      const e = await Promise.race([n.exited, sleep(30_000).then(() => null)]);
      assert.ok(e !== null, 'a node did not stop after the job ended');
      assert.equal(e.code, 0, explainExit(e));
    }

    // Acknowledgements never stopped for long, the takeover included.
    let largest = 0; let at = 0;
    for (let i = 1; i < ackTimes.length; i++) {
      const gap = ackTimes[i]! - ackTimes[i - 1]!;
      if (gap > largest) { largest = gap; at = ackTimes[i - 1]!; }
    }
    const around = ackTimes.filter((x) => x >= killedAt - 1_000 && x <= killedAt + 10_000);
    let largestAround = 0;
    for (let i = 1; i < around.length; i++) largestAround = Math.max(largestAround, around[i]! - around[i - 1]!);
    t.diagnostic(`largest gap between acknowledgements: ${largest} ms (${at - killedAt} ms from the kill); around the takeover: ${largestAround} ms; `
      + `${ackTimes.filter((x) => x > killedAt && x < killedAt + takeoverMs).length} acknowledged while no scheduler ran`);
    assert.ok(largest < 5_000, `acknowledgements stopped for ${largest} ms`);

    const s = JSON.parse(await readFile(standbySummary, 'utf8')) as Summary;
    assert.equal(s.batches, total);
    assertNothingLost(s, acks);
    assert.equal(s.scheduler.acks_seen_from, 'job_start');
    assert.equal(s.scheduler.takeovers.length, 1, JSON.stringify(s.scheduler));
    const tk = s.scheduler.takeovers[0]!;
    assert.equal(tk.from, `driver@${hostname()}:${active.pid}`);
    assert.equal(tk.to, `driver@${hostname()}:${standby.pid}`);
    assert.equal(s.scheduler.holder, tk.to);
    assert.ok(tk.lease_gap_ms >= s.scheduler.lease_ms, `lease gap ${tk.lease_gap_ms} ms`);
    t.diagnostic(`takeover ${JSON.stringify(tk)}; test AUC ${s.test_auc.toFixed(4)}`);
  } finally {
    for (const c of [...drivers, ...nodes]) c.child.kill('SIGKILL');
    await nc.close();
  }
});
