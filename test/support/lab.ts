/**
 * The network lab (deploy/netlab.ts) and a local NATS cluster listening on
 * every interface, so a lab node reaches it through its link's host address:
 * for one test file, made before its tests and disposed after them. Where
 * the lab cannot run (no root, no iproute2) the file's tests fail with the
 * reason rather than skip.
 */
import { after, before } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startLocalCluster, type LocalCluster } from '../../deploy/local-cluster.ts';
import { NetLab } from '../../deploy/netlab.ts';
import { BIN, ROOT, hetps, type Child } from './ps.ts';
import { until } from './until.ts';

export interface LabFixture {
  cluster: () => LocalCluster;
  lab: () => NetLab;
  /** The file's temp dir (the cluster's data is under `nats/`). */
  dir: () => string;
}

export function labAndClusterForFile(o: { prefix: string; lab: string; natsNodes: number }): LabFixture {
  let cluster: LocalCluster | null = null;
  let lab: NetLab | null = null;
  let dir = '';
  before(async () => {
    const available = await NetLab.available();
    assert.ok(available.ok, available.ok ? '' : `the network lab cannot run here: ${available.reason}`);
    dir = await mkdtemp(join(tmpdir(), o.prefix));
    cluster = await startLocalCluster({ nodes: o.natsNodes, dir: join(dir, 'nats'), listenHost: '0.0.0.0', readyTimeoutMs: 60_000 });
    lab = await NetLab.create({ name: o.lab });
  });
  after(async () => {
    await lab?.[Symbol.asyncDispose]();
    await cluster?.[Symbol.asyncDispose]();
    if (dir) await rm(dir, { recursive: true, force: true });
  });
  return { cluster: () => cluster!, lab: () => lab!, dir: () => dir };
}

/** Collects a lab child's stdout and stderr. */
export function collectOutput(child: ChildProcess): () => string {
  let text = '';
  child.stdout?.on('data', (d: Buffer) => { text += d.toString(); });
  child.stderr?.on('data', (d: Buffer) => { text += d.toString(); });
  return () => text;
}

/**
 * The job of writeJobConfig's cluster with w1 in the lab: servers s1 and s2
 * and workers w2–w4 on the host (pushed to `children` as they start, for the
 * caller to stop), w1 in its own namespace reaching the cluster over its
 * link (rate-limited to `w1Mbps` when given). Resolves once every worker has
 * profiled itself and waits for the job; w1 is killed if that fails.
 */
export async function launchWithW1InLab(fx: LabFixture, o: { cfg: string; job: string; children: Child[]; w1Mbps?: number; readyMs: number }): Promise<{ w1: ChildProcess; w1Out: () => string; others: Child[] }> {
  const { cfg, job, children } = o;
  for (const s of ['s1', 's2']) children.push(hetps(['launch', '--role', 'server', '--config', cfg, '--server-id', s], { timeoutMs: 290_000 }));
  const link = await fx.lab().addNode('w1');
  if (o.w1Mbps !== undefined) await fx.lab().rateLimit('w1', o.w1Mbps);
  const w1 = fx.lab().spawn('w1', process.execPath, [BIN, 'launch', '--role', 'worker', '--config', cfg, '--group', 'g1', '--node-rank', '0', '--nats', fx.cluster().urlsFor(link.hostIp).join(','), '--job', job],
    { cwd: ROOT, env: { ...process.env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const w1Out = collectOutput(w1);
  const others = [['g1', '1'], ['g2', '0'], ['g2', '1']].map(([g, r]) =>
    hetps(['launch', '--role', 'worker', '--config', cfg, '--group', g!, '--node-rank', r!], { timeoutMs: 290_000 }));
  children.push(...others);
  try {
    // Every node profiles itself when it joins: let them finish before the driver starts.
    await until(() => /ready; waiting for the job/.test(w1Out()) && others.every((w) => /ready; waiting for the job/.test(w.stderr())),
      'every worker ready', o.readyMs, () => `w1:\n${w1Out().slice(-2000)}`);
  } catch (e) {
    w1.kill('SIGKILL');
    throw e;
  }
  return { w1, w1Out, others };
}
