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
