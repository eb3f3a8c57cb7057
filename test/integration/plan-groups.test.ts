/** `hetps plan groups` as a user runs it, and a node profile measured over a real nats-server. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startTestCluster } from '../support/cluster.ts';
import { connectTransport } from '../../runtime/mod.ts';
import { measureNodeProfile } from '../../actors/node/node-profile.ts';
import { groupNodes, parseNodeProfiles } from '../../topology/grouping.ts';

const run = promisify(execFile);
const bin = new URL('../../bin/hetps.mjs', import.meta.url).pathname;
const hetps = (args: string[]) => run(process.execPath, [bin, ...args], { timeout: 60_000 });

function profile(node: string, gflops: number, bw: number) {
  return {
    node, matmul_gflops: gflops, gather_rows_per_s: gflops * 20_000, memory_gb: 32, cpus: 8, providers: ['cpu'], variance: 0.02,
    bandwidth_mbps: bw, rtt_ms: 0.3,
  };
}

const PROFILES = [
  profile('a100-1', 400, 20_000), profile('a100-2', 420, 19_000), profile('a100-3', 390, 21_000),
  profile('v100-1', 110, 9_000), profile('v100-2', 100, 10_000), profile('v100-3', 95, 9_500),
  profile('cpu-1', 15, 1_000), profile('cpu-2', 14, 900),
];

async function withFile<T>(name: string, content: string, fn: (path: string) => Promise<T>): Promise<T> {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-plan-'));
  try {
    const path = join(dir, name);
    await writeFile(path, content);
    return await fn(path);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test('plan groups says which k it passed over as splits of alike nodes, and why', { timeout: 60_000 }, async () => {
  // Four like A100s whose links probed 20.0 / 20.3 against 15.5 / 15.6 Gbit/s: k = 4 scores highest by silhouette, but
  // its two A100 groups differ by no more than measurement noise (ln 0.26 against twice the bandwidth floor, 0.4).
  const profiles = [
    profile('a100-1', 400, 20_000), profile('a100-2', 400, 20_300), profile('a100-3', 400, 15_500), profile('a100-4', 400, 15_600),
    profile('v100-1', 110, 5_000), profile('v100-2', 110, 5_100), profile('cpu-1', 15, 1_000), profile('cpu-2', 15, 1_010),
  ];
  await withFile('profiles.json', JSON.stringify(profiles), async (file) => {
    const text = (await hetps(['plan', 'groups', '--profiles', file])).stdout;
    assert.match(text, /^3 groups \(silhouette, silhouette 0\.95\d+\): k=3: highest mean silhouette .*; k=4, 5 refused: groups within measurement noise of each other\n/);
    assert.match(text, /\n  g0: a100-1, a100-2, a100-3, a100-4 /);
    assert.match(text, /\n  not k=4 \(silhouette 0\.97\d+\): groups \[a100-1,a100-2\] and \[a100-3,a100-4\] differ by no more than measurement noise on any feature \(widest: bandwidth 0\.259 against 0\.4\)\n/);
    const out = JSON.parse((await hetps(['plan', 'groups', '--profiles', file, '--json'])).stdout) as { k: number; candidates: { k: number; score: number; refused?: string }[] };
    assert.equal(out.k, 3);
    assert.deepEqual(out.candidates.map((c) => [c.k, c.refused !== undefined]), [[3, false], [4, true], [5, true]]);
  });
});

test('plan groups --json prints k, criterion, score and the groups, fastest first', { timeout: 60_000 }, async () => {
  await withFile('profiles.json', JSON.stringify(PROFILES), async (file) => {
    const { stdout } = await hetps(['plan', 'groups', '--profiles', file, '--json', '--seed', '3']);
    const out = JSON.parse(stdout) as { k: number; criterion: string; score: number; groups: { name: string; nodes: string[] }[] };
    assert.equal(out.k, 3);
    assert.equal(out.criterion, 'silhouette');
    assert.ok(out.score > 0.5 && out.score <= 1);
    assert.deepEqual(out.groups.map((g) => ({ name: g.name, nodes: g.nodes })), [
      { name: 'g0', nodes: ['a100-1', 'a100-2', 'a100-3'] },
      { name: 'g1', nodes: ['v100-1', 'v100-2', 'v100-3'] },
      { name: 'g2', nodes: ['cpu-1', 'cpu-2'] },
    ]);

    const fixed = JSON.parse((await hetps(['plan', 'groups', '--profiles', file, '--json', '--k', '2'])).stdout) as { k: number; criterion: string };
    assert.deepEqual([fixed.k, fixed.criterion], [2, 'fixed']);

    const text = (await hetps(['plan', 'groups', '--profiles', file])).stdout;
    assert.match(text, /^3 groups \(silhouette/);
    assert.match(text, /g2: cpu-1, cpu-2/);
  });
});

test('plan groups names the index and field of a bad profile', { timeout: 60_000 }, async () => {
  const bad = PROFILES.map((p, i) => (i === 2 ? { ...p, bandwidth_mbps: -5 } : i === 4 ? { ...p, rtt_ms: undefined } : p));
  await withFile('bad.json', JSON.stringify(bad), async (file) => {
    await assert.rejects(hetps(['plan', 'groups', '--profiles', file, '--json']), (e: { code: number; stderr: string; stdout: string }) => {
      assert.equal(e.code, 2);
      assert.equal(e.stdout, '');
      assert.match(e.stderr, /ConfigError: .*bad\.json: 2 problems/);
      assert.match(e.stderr, /\[2\]\.bandwidth_mbps \(node "a100-3"\) must be a number > 0, got -5/);
      assert.match(e.stderr, /\[4\]\.rtt_ms \(node "v100-2"\) is required/);
      return true;
    });
  });
  await withFile('broken.json', '[{"node": "a",', async (file) => {
    await assert.rejects(hetps(['plan', 'groups', '--profiles', file]), (e: { code: number; stderr: string }) => e.code === 2 && /is not valid JSON/.test(e.stderr));
  });
  await assert.rejects(hetps(['plan', 'groups', '--profiles', '/nonexistent/p.json']), (e: { code: number; stderr: string }) => e.code === 2 && /does not exist/.test(e.stderr));
  await withFile('p.json', JSON.stringify(PROFILES), async (file) => {
    await assert.rejects(hetps(['plan', 'groups', '--profiles', file, '--k', '0']), (e: { code: number; stderr: string }) => e.code === 2 && /--k must be an integer ≥ 1/.test(e.stderr));
  });
});

test('a node profile measured over nats-server: rtt and bandwidth against the server, labelled nats', { timeout: 120_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 1, jetstream: false });
  const transport = await connectTransport({ servers: nats.urls, name: 'profile-n1' });
  t.after(() => transport.close());
  const p = await measureNodeProfile({ transport, node: 'n1', deviceOptions: { repeats: 2, secondsPerRepeat: 0.1 } });
  assert.equal(p.link, 'nats');
  assert.equal(p.emulated, false);
  assert.ok(p.rtt_ms > 0 && Number.isFinite(p.rtt_ms), `rtt ${p.rtt_ms} ms`);
  assert.ok(p.bandwidth_mbps > 0 && Number.isFinite(p.bandwidth_mbps), `bandwidth ${p.bandwidth_mbps} Mbit/s`);
  assert.ok(p.matmul_gflops > 0 && p.gather_rows_per_s > 0);
  t.diagnostic(`rtt ${p.rtt_ms} ms, bandwidth ${p.bandwidth_mbps} Mbit/s, matmul ${p.matmul_gflops} GFLOP/s`);

  // The same box emulated at a quarter speed lands in another group than itself at full speed.
  const slow = await measureNodeProfile({
    transport, node: 'n1-slow', device: { ...p, providers: ['cpu'] }, emulate: { speed: 0.25, bandwidth_mbps: 100 , link: 'hold' },
  });
  assert.equal(slow.emulated, true);
  const g = groupNodes([p, { ...p, node: 'n2' }, slow, { ...slow, node: 'n2-slow' }]);
  assert.deepEqual(g.groups.map((x) => x.nodes), [['n1', 'n2'], ['n1-slow', 'n2-slow']]);
});

test('profile --network --json prints a profile that plan groups accepts', { timeout: 120_000 }, async () => {
  const { stdout, stderr } = await hetps(['profile', '--network', '--json', '--repeats', '2', '--node', 'p1']);
  const p = JSON.parse(stdout) as Record<string, unknown>;
  assert.equal(p.link, 'embedded');
  assert.match(stderr, /in-process bus/);
  assert.deepEqual(parseNodeProfiles([p], 'stdout')[0], p);
  await withFile('one.json', JSON.stringify([p]), async (file) => {
    const out = JSON.parse((await hetps(['plan', 'groups', '--profiles', file, '--json'])).stdout) as { k: number; groups: { nodes: string[] }[] };
    assert.deepEqual([out.k, out.groups[0]!.nodes], [1, ['p1']]);
  });
});
