/**
 * The CLI's progress display (cli/progress.ts) and the terminal views of
 * `hetps ctl status`, `hetps top` and `hetps tail` (cli/ctl.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PassThrough } from 'node:stream';
import { ProgressLine } from '../../cli/progress.ts';
import { formatStatus, telemetryLine, topScreen } from '../../cli/ctl.ts';

function stream(tty: boolean) {
  const s = new PassThrough() as PassThrough & { isTTY?: boolean; columns?: number };
  s.isTTY = tty;
  s.columns = 160;
  let text = '';
  s.on('data', (d: Buffer) => { text += d.toString(); });
  return { s, text: () => text };
}

test('ProgressLine off a terminal: a line per quarter of the work (or per interval), lines in between as they come, the last figures at the end', async () => {
  const o = stream(false);
  const p = new ProgressLine(o.s, { plainEveryMs: 60_000 });
  p.update('10%', 0.1);
  p.update('20%', 0.2);
  p.update('30%', 0.3);
  p.line('a note');
  p.update('60%', 0.6);
  p.update('70%', 0.7);
  p.end();
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(o.text().split('\n').filter(Boolean), ['10%', '30%', 'a note', '60%', '70%'],
    'the first update, each new quarter (30 %: the second, 60 %: the third), and the last one at the end');
});

test('ProgressLine on a terminal: a cli-progress bar with the text beside it; lines go above it', async () => {
  const o = stream(true);
  const p = new ProgressLine(o.s);
  p.update('training: 5/10 batches', 0.5);
  p.line('a log line');
  p.update('training: 10/10 batches', 1);
  p.end();
  await new Promise((r) => setImmediate(r));
  const text = o.text();
  assert.match(text, /training: 10\/10 batches/);
  assert.match(text, /100%/);
  assert.match(text, /a log line/);
  assert.equal(text.split('a log line').length, 2, 'printed once');
  assert.ok(text.indexOf('a log line') < text.indexOf('training: 10/10'), 'above the bar: drawn before its next state');
  assert.match(text, /\u001b\[2Ka log line\n/, 'on a cleared line of its own');
});

const status = {
  job: 'j', state: 'training', mode: 'hps', run_id: 'r1',
  progress: { samples: 6400, batches_acked: 200, batches_total: 400, samples_per_s: 321.4, loss: 0.51234 },
  groups: [{ name: 'fast', sync_mode: 'sync', members: [{ node: 'w1', state: 'training' }, { node: 'w2', state: 'paused' }] }],
  workers: [
    { node: 'w1', group: 'fast', state: 'training', health: 'alive', steps: 100, samples_per_s: 160, utilisation: 0.75, last_heartbeat_ms: 120 },
    { node: 'w2', group: 'fast', state: 'paused', health: 'suspect', steps: 90, samples_per_s: 0, utilisation: null, last_heartbeat_ms: null },
  ],
  shards: [{ shard: 's0', primary: 'server-1', state: 'alive', version: 42, pulls: 300, pushes: 150, rows: 1000, bytes: 2048 }],
  events: [{ at_ms: Date.UTC(2026, 0, 1, 12, 0, 0), kind: 'pause', text: 'pause requested' }],
};

test('status, top and tail views name every worker, group and shard with their figures', () => {
  const s = formatStatus(status);
  assert.match(s, /job j \(hps, run r1\): training; 200\/400 batches, 6400 samples, 321 samples\/s, loss 0\.5123/);
  assert.match(s, /worker w2 \[fast\]: paused \(suspect\), 90 steps/);
  assert.match(s, /shard s0 on server-1: alive, v42, 300 pulls, 150 pushes, 1000 rows/);
  const top = topScreen(status, new Date(Date.UTC(2026, 0, 1, 12, 0, 5)));
  assert.match(top, /hetps top — job j \(hps\) training {2}12:00:05/);
  assert.match(top, /batches 200\/400 \(50%\)/);
  assert.match(top, /^w1 +fast +training +alive +100 +160 +75% +120 ms$/m);
  assert.match(top, /^w2 +fast +paused +suspect +90 +0 +- +-$/m);
  assert.match(top, /^fast +sync +w1:training w2:paused$/m);
  assert.match(top, /^s0 +server-1 +alive +42 +300 +150 +1000 +2048$/m);
  assert.match(top, /12:00:00 pause: pause requested/);
  const line = telemetryLine('batch', 'w1', { node: 'w1', batch_id: 'b7', loss: 0.5, ids: new Int32Array([1, 2]) }, new Date(Date.UTC(2026, 0, 1, 12, 0, 1, 250)));
  assert.equal(line, '12:00:01.250 batch    w1           batch_id=b7 loss=0.5 ids=[1,2]');
});
