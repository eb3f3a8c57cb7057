/**
 * The network lab (deploy/netlab.ts) against the real kernel: a node process
 * in its own namespace reaches a local NATS cluster over its veth link; a cut
 * link stops its traffic and a healed one brings it back; a rate limit
 * stretches a transfer to what the bit rate allows; dispose leaves no
 * namespace or interface behind.
 *
 * Needs root and iproute2 (CI runs as root). Where the lab cannot run, the
 * tests fail with the reason instead of skipping, so a CI machine that lost
 * the capability does not pass quietly.
 */
import { after, before, describe, it, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { startLocalCluster, type LocalCluster } from '../../deploy/local-cluster.ts';
import { NetLab, type LabNode } from '../../deploy/netlab.ts';
import { until } from '../support/until.ts';

const CLIENT = fileURLToPath(new URL('../support/netlab-client.mjs', import.meta.url));
const READY_MS = 60_000;

function sh(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { encoding: 'utf8' }, (e, stdout, stderr) => (e ? reject(new Error(`${cmd} ${args.join(' ')}: ${stderr || e.message}`)) : resolve(stdout)));
  });
}

/** Collects a child's stderr (its connection events), for failure messages. */
function stderrOf(child: ChildProcess): () => string {
  let text = '';
  child.stderr?.setEncoding('utf8');
  child.stderr?.on('data', (d: string) => { text += d; });
  return () => text.split('\n').slice(-30).join('\n');
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test('the network lab can run here (root, iproute2, a namespace with a veth and a tbf qdisc)', async () => {
  const available = await NetLab.available();
  assert.ok(available.ok, available.ok ? '' : `the network lab cannot run here: ${available.reason}`);
});

test('a cluster listening on 127.0.0.1 only refuses to hand out URLs for a lab node', { timeout: 90_000 }, async () => {
  await using cluster = await startLocalCluster({ nodes: 1, jetstream: false, readyTimeoutMs: READY_MS });
  assert.equal(cluster.listenHost, '127.0.0.1');
  assert.deepEqual(cluster.urlsFor('127.0.0.1'), cluster.urls);
  assert.throws(() => cluster.urlsFor('10.200.0.1'), /listens for clients on 127\.0\.0\.1 only.*listenHost: '0\.0\.0\.0'/);
});

describe('network lab', { timeout: 180_000 }, () => {
  let cluster: LocalCluster | null = null;
  let lab: NetLab | null = null;
  let nc: NatsConnection | null = null;
  let node: LabNode;

  before(async () => {
    const available = await NetLab.available();
    if (!available.ok) assert.fail(`the network lab cannot run here: ${available.reason}`);
    cluster = await startLocalCluster({ nodes: 3, listenHost: '0.0.0.0', jetstream: false, readyTimeoutMs: READY_MS });
    lab = await NetLab.create({ name: 'netlab-test' });
    node = await lab.addNode('w1');
    nc = await connect({ servers: cluster.urls, name: 'netlab-test-host' });
  });

  after(async () => {
    await nc?.close().catch(() => undefined);
    await lab?.dispose().catch(() => undefined);
    await cluster?.[Symbol.asyncDispose]();
  });

  it('gives the node its own namespace, a link with an address on each end, and the cluster by the host address', async () => {
    assert.match(node.netns, new RegExp(`^hetps-${lab!.prefix}-w1$`));
    assert.ok(node.hostIf.length <= 15 && node.nodeIf.length <= 15, `interface names within 15 characters: ${node.hostIf}, ${node.nodeIf}`);
    assert.match(await sh('ip', ['-o', '-4', 'addr', 'show', 'dev', node.hostIf]), new RegExp(`inet ${node.hostIp.replace(/\./g, '\\.')}/30`));
    assert.match(await sh('ip', ['-n', node.netns, '-o', '-4', 'addr', 'show', 'dev', node.nodeIf]), new RegExp(`inet ${node.nodeIp.replace(/\./g, '\\.')}/30`));
    assert.match(await sh('ip', ['-n', node.netns, 'route', 'show', 'default']), new RegExp(`via ${node.hostIp.replace(/\./g, '\\.')}`));
    assert.equal(cluster!.listenHost, '0.0.0.0');
    for (const u of cluster!.urls) assert.match(u, /^nats:\/\/127\.0\.0\.1:\d+$/, 'the host itself still connects on 127.0.0.1');
    const urls = cluster!.urlsFor(node.hostIp);
    assert.deepEqual(urls.map((u) => new URL(u).port), cluster!.urls.map((u) => new URL(u).port));
    for (const u of urls) assert.equal(new URL(u).hostname, node.hostIp);
  });

  it('stops a node\'s ticks while its link is cut and gets them back after heal', async (t) => {
    const subject = `netlab.${lab!.prefix}.ticks`;
    const arrivals: { seq: number; at: number; got: number }[] = [];
    const sub = nc!.subscribe(subject, {
      callback: (_e, m) => {
        const { seq, at } = m.json<{ seq: number; at: number }>();
        arrivals.push({ seq, at, got: Date.now() });
      },
    });
    t.after(() => sub.unsubscribe());
    await nc!.flush();

    const ticker = lab!.spawn('w1', process.execPath, [CLIENT, 'tick', subject, cluster!.urlsFor(node.hostIp).join(',')], { stdio: ['ignore', 'ignore', 'pipe'] });
    const log = stderrOf(ticker);
    t.after(() => { ticker.kill('SIGKILL'); });

    await until(() => arrivals.length >= 5, 'ticks from the namespace', 30_000, () => `got ${arrivals.length}; ticker stderr:\n${log()}`);

    await lab!.cut('w1');
    assert.equal(await lab!.isUp('w1'), false);
    await sleep(300); // what was already on the wire
    const before = arrivals.length;
    await sleep(1_500);
    assert.equal(arrivals.length, before, `${arrivals.length - before} ticks arrived while the link was cut`);

    await lab!.heal('w1');
    const healedAt = Date.now();
    await until(() => arrivals.length > before, 'a tick after heal', 30_000, () => `ticker stderr:\n${log()}`);
    const firstBack = arrivals[before]!.got - healedAt;
    // A tick published after the heal, not one buffered during the cut.
    await until(() => arrivals.some((a) => a.at >= healedAt), 'a tick published after heal', 30_000, () => `ticker stderr:\n${log()}`);
    const fresh = arrivals.find((a) => a.at >= healedAt)!;
    const events = log().split('\n').filter((l) => l.includes('"status"')).map((l) => (JSON.parse(l) as { status: string }).status).filter((s) => s !== 'ping');
    t.diagnostic(`first tick ${firstBack} ms after heal; first tick published after heal arrived ${fresh.got - healedAt} ms after it; ` +
      `client connection events: ${events.length ? events.join(', ') : 'none (the TCP connection rode out the cut)'}`);
    const seqs = arrivals.map((a) => a.seq);
    assert.ok(seqs.every((s, i) => i === 0 || s > seqs[i - 1]!), 'ticks arrive in order');
  });

  it('limits the link to 1 Mbit/s in both directions, and clearRate removes the limit', async (t) => {
    await lab!.rateLimit('w1', 1);
    assert.match(await sh('tc', ['qdisc', 'show', 'dev', node.hostIf]), /tbf .*rate 1Mbit/);
    assert.match(await sh('ip', ['netns', 'exec', node.netns, 'tc', 'qdisc', 'show', 'dev', node.nodeIf]), /tbf .*rate 1Mbit/);

    const subject = `netlab.${lab!.prefix}.bytes`;
    let received = 0;
    const sub = nc!.subscribe(subject, { callback: (_e, m) => { received += m.data.byteLength; } });
    t.after(() => sub.unsubscribe());
    await nc!.flush();

    const send = async (bytes: number): Promise<number> => {
      received = 0;
      const child = lab!.spawn('w1', process.execPath, [CLIENT, 'send', subject, String(bytes), cluster!.urlsFor(node.hostIp).join(',')], { stdio: ['ignore', 'pipe', 'pipe'] });
      const log = stderrOf(child);
      let out = '';
      child.stdout!.setEncoding('utf8');
      child.stdout!.on('data', (d: string) => { out += d; });
      const code = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
      assert.equal(code, 0, `sender exited ${code}; stderr:\n${log()}`);
      const { ms } = JSON.parse(out.trim().split('\n').pop()!) as { bytes: number; ms: number };
      await until(() => received >= bytes, `all ${bytes} bytes at the host subscriber`, 30_000, () => `got ${received}`);
      return ms;
    };

    // 500 KiB at 1 Mbit/s: at least (512000 B - 16 KiB bucket) * 8 / 1e6 = 3.96 s, whatever the machine.
    const limitedMs = await send(512_000);
    assert.ok(limitedMs >= 3_000, `500 KiB through a 1 Mbit/s link took only ${limitedMs} ms`);

    await lab!.clearRate('w1');
    assert.doesNotMatch(await sh('tc', ['qdisc', 'show', 'dev', node.hostIf]), /tbf/);
    assert.doesNotMatch(await sh('ip', ['netns', 'exec', node.netns, 'tc', 'qdisc', 'show', 'dev', node.nodeIf]), /tbf/);
    await lab!.clearRate('w1'); // nothing set: fine
    const freeMs = await send(512_000);
    t.diagnostic(`500 KiB from the namespace: ${limitedMs} ms at 1 Mbit/s, ${freeMs} ms unlimited`);
  });

  it('dispose kills what it spawned and removes every namespace and veth it made', async () => {
    const sleeper = lab!.spawn('w1', 'sleep', ['600']);
    const second = await lab!.addNode('w2');
    await lab!.dispose();
    await lab!.dispose(); // idempotent
    assert.ok(sleeper.exitCode !== null || sleeper.signalCode !== null, 'the spawned process is gone');
    const namespaces = await sh('ip', ['netns', 'list']);
    assert.doesNotMatch(namespaces, new RegExp(`hetps-${lab!.prefix}-`), namespaces);
    const links = await sh('ip', ['-o', 'link', 'show']);
    for (const name of [node.hostIf, second.hostIf]) assert.doesNotMatch(links, new RegExp(`: ${name}[@:]`), links);
    assert.equal(existsSync(lab!.lockPath), false, `the lab's lock file ${lab!.lockPath} is removed`);
    await assert.rejects(lab!.addNode('w3'), /was disposed/);
  });
});
