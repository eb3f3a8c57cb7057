/**
 * The local NATS cluster launcher, its CLI and the test harness, against real
 * nats-server processes. These test the launcher itself, so they start their
 * own servers even when NATS_URL is set.
 */
import { describe, it, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import {
  findNatsServer, loadLocalCluster, processAlive, startLocalCluster, stopLocalCluster,
  type ClusterStatus, type LocalCluster, type LocalClusterFile,
} from '../../deploy/local-cluster.ts';
import { MissingDependencyError, PortInUseError } from '../../runtime/errors.ts';
import { startTestCluster } from '../support/cluster.ts';

const repoRoot = fileURLToPath(new URL('../../', import.meta.url));
const READY_MS = 60_000; // shared 2-core machines: generous, never a speed assertion

async function tempDir(t: { after: (fn: () => Promise<void>) => void }): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-lc-test-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return dir;
}

/** Polls until `check` holds; the last status is in the failure message. */
async function eventually(cluster: { status(): Promise<ClusterStatus> }, check: (s: ClusterStatus) => boolean, timeoutMs = 20_000): Promise<ClusterStatus> {
  const deadline = Date.now() + timeoutMs;
  let last: ClusterStatus;
  for (;;) {
    last = await cluster.status();
    if (check(last)) return last;
    if (Date.now() > deadline) assert.fail(`condition not reached; last status ${JSON.stringify(last)}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

function byName(s: ClusterStatus, name: string) {
  const n = s.nodes.find((x) => x.name === name);
  assert.ok(n, `no ${name} in ${JSON.stringify(s)}`);
  return n;
}

/** Publishes until the subscriber on the other connection sees a message (interest crosses routes asynchronously). */
async function assertCrossNodeDelivery(pub: NatsConnection, sub: NatsConnection, subject: string): Promise<void> {
  const s = sub.subscribe(subject, { max: 1 });
  await sub.flush();
  const got = (async () => { for await (const m of s) return m.string(); return null; })();
  let done = false;
  void got.finally(() => { done = true; });
  const deadline = Date.now() + 15_000;
  while (!done && Date.now() < deadline) {
    pub.publish(subject, 'across-the-route');
    await pub.flush();
    await new Promise((r) => setTimeout(r, 100));
  }
  if (!done) s.unsubscribe();
  assert.equal(await got, 'across-the-route', 'no message crossed from one node to the other');
}

function runCli(args: string[], env: NodeJS.ProcessEnv = process.env): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [join(repoRoot, 'bin/hetps.mjs'), ...args], { cwd: repoRoot, env, timeout: 120_000 }, (err, stdout, stderr) => {
      const code = err ? (typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1) : 0;
      resolve({ code, stdout, stderr });
    });
  });
}

/** `count` consecutive ports from `base`, all free on 127.0.0.1 right now. */
async function freeBlock(count: number, avoid: number[] = []): Promise<number> {
  for (let attempt = 0; attempt < 50; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 10_000);
    const ports = Array.from({ length: count }, (_, i) => base + i);
    if (ports.some((p) => avoid.includes(p))) continue;
    const free = await Promise.all(ports.map((p) => new Promise<boolean>((res) => {
      const s = createServer();
      s.once('error', () => res(false));
      s.listen({ port: p, host: '127.0.0.1', exclusive: true }, () => s.close(() => res(true)));
    })));
    if (free.every(Boolean)) return base;
  }
  throw new Error('no free block of ports found');
}

describe('local NATS cluster (random ports)', () => {
  let cluster: LocalCluster;
  const conns: NatsConnection[] = [];

  before(async () => {
    cluster = await startLocalCluster({ nodes: 3, readyTimeoutMs: READY_MS });
  });
  after(async () => {
    await Promise.all(conns.map((c) => c.close().catch(() => undefined)));
    await cluster?.[Symbol.asyncDispose]();
  });

  it('starts three nodes that each report routes to the two others', async () => {
    assert.equal(cluster.urls.length, 3);
    for (const u of cluster.urls) assert.match(u, /^nats:\/\/127\.0\.0\.1:\d+$/);
    const s = await cluster.status();
    assert.deepEqual(s.nodes.map((n) => [n.name, n.routes, n.running]), [['n1', 2, true], ['n2', 2, true], ['n3', 2, true]]);
    const file = JSON.parse(readFileSync(join(cluster.dir, 'cluster.json'), 'utf8')) as LocalClusterFile;
    assert.deepEqual(file.nodes.map((n) => n.client_url), cluster.urls);
    for (const n of file.nodes) {
      assert.ok(processAlive(n.pid, n.conf));
      assert.ok(existsSync(n.conf) && existsSync(n.log));
      assert.equal(typeof n.cluster_port, 'number');
    }
  });

  it('delivers a message published on one node to a subscriber on another', async () => {
    const pub = await connect({ servers: cluster.urls[0]! });
    const sub = await connect({ servers: cluster.urls[2]! });
    conns.push(pub, sub);
    assert.equal(pub.info?.server_name, 'n1');
    assert.equal(sub.info?.server_name, 'n3');
    await assertCrossNodeDelivery(pub, sub, 'hetps.test.cross');
  });

  it('after SIGKILL of one node, status shows it down and the survivors keep their mutual route; restart brings it back', async () => {
    await cluster.kill('n2');
    const s = await eventually(cluster, (st) => byName(st, 'n1').routes === 1 && byName(st, 'n3').routes === 1);
    assert.deepEqual(byName(s, 'n2'), { name: 'n2', client_url: cluster.urls[1], routes: 0, running: false });
    assert.equal(byName(s, 'n1').running, true);
    assert.equal(byName(s, 'n3').running, true);

    // The loaded view (what `hetps nats status` uses) agrees.
    const loaded = await loadLocalCluster(cluster.dir);
    assert.equal(byName(await loaded.status(), 'n2').running, false);

    const urlBefore = cluster.urls[1];
    await cluster.restart('n2');
    assert.equal(cluster.urls[1], urlBefore, 'restart keeps the client URL');
    await eventually(cluster, (st) => st.nodes.every((n) => n.running && n.routes === 2));
  });
});

describe('local NATS cluster (fixed ports)', () => {
  it('uses base+i ports and forms a full mesh', async (t) => {
    const dir = await tempDir(t);
    const base = await freeBlock(30);
    const cluster = await startLocalCluster({
      nodes: 3, dir, clientPort: base, clusterPort: base + 10, httpPort: base + 20, readyTimeoutMs: READY_MS,
    });
    t.after(() => cluster.stop());
    assert.deepEqual(cluster.urls, [0, 1, 2].map((i) => `nats://127.0.0.1:${base + i}`));
    assert.deepEqual(cluster.nodes.map((n) => [n.cluster_port, n.http_port]), [0, 1, 2].map((i) => [base + 10 + i, base + 20 + i]));
    const s = await cluster.status();
    assert.ok(s.nodes.every((n) => n.routes === 2), JSON.stringify(s));
  });

  it('fails with PortInUseError naming a port that is already held, starting nothing', async (t) => {
    const dir = await tempDir(t);
    const holder: Server = createServer();
    await new Promise<void>((r) => holder.listen({ port: 0, host: '127.0.0.1' }, () => r()));
    t.after(() => new Promise<void>((r) => holder.close(() => r())));
    const held = (holder.address() as { port: number }).port;

    await assert.rejects(
      startLocalCluster({ nodes: 3, dir, clientPort: held, clusterPort: null, httpPort: null, readyTimeoutMs: READY_MS }),
      (e: unknown) => {
        assert.ok(e instanceof PortInUseError, String(e));
        assert.match(e.message, new RegExp(`port ${held} \\(client port of n1\\)`));
        assert.match(e.message, /--port/);
        assert.equal(e.data?.port, held);
        return true;
      },
    );
    assert.equal(existsSync(join(dir, 'cluster.json')), false, 'nothing was started');
  });
});

describe('hetps nats CLI', () => {
  it('up → status --json → down, end to end', async (t) => {
    const dir = await tempDir(t);
    // Runs even when an assertion fails: whatever `up` left running is stopped.
    t.after(async () => { if (existsSync(join(dir, 'cluster.json'))) await stopLocalCluster(dir); });

    const up = await runCli(['nats', 'up', '--nodes', '3', '--dir', dir, '--port', '0', '--max-payload', '64K', '--timeout', '60']);
    assert.equal(up.code, 0, `nats up failed:\n${up.stderr}`);
    assert.match(up.stdout, /NATS_URL=nats:\/\/127\.0\.0\.1:\d+,nats:\/\/127\.0\.0\.1:\d+,nats:\/\/127\.0\.0\.1:\d+/);
    assert.match(up.stderr, /ready/);

    const st = await runCli(['nats', 'status', '--dir', dir, '--json']);
    assert.equal(st.code, 0, st.stderr);
    const parsed = JSON.parse(st.stdout) as { nodes: { name: string; client_url: string; routes: number }[] };
    assert.equal(parsed.nodes.length, 3);
    for (const n of parsed.nodes) {
      assert.deepEqual(Object.keys(n).sort(), ['client_url', 'name', 'routes']);
      assert.equal(n.routes, 2, JSON.stringify(parsed));
    }

    // --max-payload reached the servers.
    const nc = await connect({ servers: parsed.nodes[0]!.client_url });
    assert.equal(nc.info?.max_payload, 64 * 1024);
    await nc.close();

    const file = JSON.parse(readFileSync(join(dir, 'cluster.json'), 'utf8')) as LocalClusterFile;
    const down = await runCli(['nats', 'down', '--dir', dir]);
    assert.equal(down.code, 0, down.stderr);
    assert.match(down.stdout, /stopped n1/);
    for (const n of file.nodes) assert.equal(processAlive(n.pid, n.conf), false, `${n.name} (pid ${n.pid}) still running`);
  });

  it('status on a directory without a cluster says how to start one', async (t) => {
    const dir = await tempDir(t);
    const st = await runCli(['nats', 'status', '--dir', dir]);
    assert.equal(st.code, 2);
    assert.match(st.stderr, /ConfigError: no local NATS cluster/);
    assert.match(st.stderr, /hetps nats up --dir/);
  });
});

describe('missing nats-server', () => {
  it('NATS_SERVER_BIN pointing nowhere gives MissingDependencyError with the install hint', async () => {
    const saved = process.env.NATS_SERVER_BIN;
    process.env.NATS_SERVER_BIN = '/nonexistent/nats-server';
    try {
      await assert.rejects(startLocalCluster({ nodes: 3 }), (e: unknown) => {
        assert.ok(e instanceof MissingDependencyError, String(e));
        assert.match(e.message, /apt-get install -y nats-server/);
        assert.match(e.message, /NATS_SERVER_BIN/);
        return true;
      });
    } finally {
      if (saved === undefined) delete process.env.NATS_SERVER_BIN;
      else process.env.NATS_SERVER_BIN = saved;
    }
  });

  it('no nats-server on PATH gives the same hint', () => {
    const saved = { path: process.env.PATH, bin: process.env.NATS_SERVER_BIN };
    process.env.PATH = '/nonexistent';
    delete process.env.NATS_SERVER_BIN;
    try {
      assert.throws(() => findNatsServer(), (e: unknown) => e instanceof MissingDependencyError && /not found on PATH/.test(e.message) && /releases/.test(e.message));
    } finally {
      process.env.PATH = saved.path;
      if (saved.bin !== undefined) process.env.NATS_SERVER_BIN = saved.bin;
    }
  });

  it('the CLI prints it and exits 2', async (t) => {
    const dir = await tempDir(t);
    const r = await runCli(['nats', 'up', '--dir', dir, '--port', '0'], { ...process.env, NATS_SERVER_BIN: '/nonexistent' });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /MissingDependencyError: .*apt-get install -y nats-server/);
  });
});

describe('test harness', () => {
  it('starts a random-port cluster and removes it on dispose', async () => {
    let dir: string;
    {
      await using nats = await startTestCluster({ nodes: 3, maxPayload: 4096 });
      assert.ok(nats.cluster);
      dir = nats.cluster.dir;
      assert.equal(nats.urls.length, 3);
      const nc = await connect({ servers: nats.urls });
      assert.equal(nc.info?.max_payload, 4096);
      await nc.close();
      await nats.kill('n3');
      assert.equal(nats.cluster.isRunning('n3'), false);
    }
    assert.equal(existsSync(dir), false, 'temp dir removed');
  });

  it('reuses NATS_URL when set: no cluster of its own, kill refuses', async () => {
    const saved = process.env.NATS_URL;
    process.env.NATS_URL = 'nats://127.0.0.1:4999, nats://127.0.0.1:5000';
    try {
      await using nats = await startTestCluster();
      assert.equal(nats.cluster, null);
      assert.deepEqual(nats.urls, ['nats://127.0.0.1:4999', 'nats://127.0.0.1:5000']);
      await assert.rejects(nats.kill('n1'), /NATS_URL/);
    } finally {
      if (saved === undefined) delete process.env.NATS_URL;
      else process.env.NATS_URL = saved;
    }
  });
});
