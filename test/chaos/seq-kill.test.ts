/**
 * Two actor processes exchange 10 000 sequenced request/replies over a real
 * 3-node cluster while the nats-server node the sender is connected to is
 * SIGKILLed. Every request must complete (retryable failures are retried with
 * the same seq) and the receiver must apply every seq exactly once.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { startTestCluster } from '../support/cluster.ts';

const TOTAL = 10_000;

interface Line { event: string; [k: string]: unknown }

function startFixture(file: string, args: string[]): { child: ChildProcess; lines: Line[]; waitFor: (pred: (l: Line) => boolean, ms: number) => Promise<Line> } {
  const child = spawn(process.execPath, ['--import', 'tsx', new URL(`./fixtures/${file}`, import.meta.url).pathname, ...args], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const lines: Line[] = [];
  const waiters: { pred: (l: Line) => boolean; resolve: (l: Line) => void }[] = [];
  createInterface({ input: child.stdout! }).on('line', (text) => {
    let l: Line;
    try { l = JSON.parse(text) as Line; } catch { return; }
    lines.push(l);
    for (const w of [...waiters]) if (w.pred(l)) { waiters.splice(waiters.indexOf(w), 1); w.resolve(l); }
  });
  const waitFor = (pred: (l: Line) => boolean, ms: number) => new Promise<Line>((resolve, reject) => {
    const hit = lines.find(pred);
    if (hit) return resolve(hit);
    const t = setTimeout(() => reject(new Error(`${file}: timed out after ${ms} ms; saw ${JSON.stringify(lines.slice(-5))}`)), ms);
    waiters.push({ pred, resolve: (l) => { clearTimeout(t); resolve(l); } });
    child.once('exit', (code) => { clearTimeout(t); reject(new Error(`${file} exited with ${code}; saw ${JSON.stringify(lines.slice(-5))}`)); });
  });
  return { child, lines, waitFor };
}

function nodeOfUrl(urls: string[], server: string): number {
  const port = server.split(':').pop();
  return urls.findIndex((u) => u.endsWith(`:${port}`));
}

test('10 000 sequenced requests survive SIGKILL of the sender\'s nats-server, each applied exactly once', { timeout: 240_000 }, async (t) => {
  await using nats = await startTestCluster({ nodes: 3 });
  if (!nats.cluster) {
    t.diagnostic('NATS_URL points at an external server: this test needs its own cluster to kill a node');
    return;
  }
  const urls = nats.urls.join(',');
  const receiver = startFixture('seq-receiver.ts', [urls]);
  const sender = startFixture('seq-sender.ts', [urls, String(TOTAL), '8']);
  try {
    await receiver.waitFor((l) => l.event === 'ready', 60_000);
    const ready = await sender.waitFor((l) => l.event === 'ready', 60_000);
    const victim = nodeOfUrl(nats.urls, String(ready.server));
    t.diagnostic(`sender connected to ${String(ready.server)}; cluster ${nats.urls.join(' ')}`);
    assert.ok(victim >= 0, `sender's server ${String(ready.server)} is one of ours`);
    sender.child.stdin!.write('go\n');

    await sender.waitFor((l) => l.event === 'progress' && Number(l.done) >= 2_000, 120_000);
    const name = nats.cluster.nodes[victim]!.name;
    t.diagnostic(`killing ${name} (${nats.urls[victim]}) with SIGKILL at ~2000 completed requests`);
    await nats.kill(name);

    const moved = await sender.waitFor((l) => l.event === 'reconnect', 60_000);
    assert.notEqual(nodeOfUrl(nats.urls, String(moved.server)), victim, 'sender reconnected to another node');

    const done = await sender.waitFor((l) => l.event === 'done', 180_000);
    t.diagnostic(`done: retried=${String(done.retried)} failures=${JSON.stringify(done.failures)} wall_ms=${String(done.wall_ms)}`);
    assert.equal(done.done, TOTAL);
    const applied = done.applied as number[];
    assert.equal(done.appliedTwice, 0, 'no seq was applied twice');
    assert.equal(applied.length, TOTAL, 'receiver applied exactly TOTAL requests');
    const sorted = [...applied].sort((a, b) => a - b);
    for (let i = 0; i < TOTAL; i++) assert.equal(sorted[i], i + 1, `seq ${i + 1} applied exactly once`);
  } finally {
    sender.child.kill('SIGKILL');
    receiver.child.kill('SIGKILL');
  }
});
