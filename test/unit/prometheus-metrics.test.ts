/**
 * The monitor's Prometheus metrics (actors/monitor/metrics.ts): telemetry and
 * a status in, text format out, read back with a third-party parser.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createRequire } from 'node:module';
import { JobMetrics, groupProgress } from '../../actors/monitor/metrics.ts';
import type { JobStatus } from '../../actors/scheduler/scheduler.messages.ts';

const parsePrometheus = createRequire(import.meta.url)('parse-prometheus-text-format') as (text: string) => {
  name: string; type: string; help: string; metrics: { value?: string; labels?: Record<string, string>; buckets?: Record<string, string>; count?: string; sum?: string }[];
}[];

function status(o: { pulls: number; pushes: number; steps: [number, number, number] }): JobStatus {
  const worker = (node: string, steps: number) => ({ node, group: null, state: 'training', health: 'alive', steps, samples: steps * 32, samples_per_s: 10, utilisation: 0.5, last_heartbeat_ms: 100, held: [], held_count: 0 });
  const shard = (name: string, primary: string) => ({
    shard: name, state: 'alive', version: o.pushes, rows: 100, bytes: 4096, pulls: o.pulls, pushes: o.pushes, last_heartbeat_ms: 50, primary, backups: [], seeding: [], replica_lag: null,
  });
  return {
    job: 'j', run_id: 'r', mode: 'hps', state: 'training', plan_version: 1,
    groups: [{ name: 'fast', sync_mode: 'sync', members: [{ node: 'f1', state: 'training' }, { node: 'f2', state: 'training' }] }, { name: 'slow', sync_mode: 'sync', members: [{ node: 's1', state: 'training' }] }],
    workers: [worker('f1', o.steps[0]), worker('f2', o.steps[1]), worker('s1', o.steps[2])],
    shards: [shard('s0', 'server-1'), shard('s1', 'server-2')],
    progress: { samples: 640, batches_acked: 20, batches_total: 100, samples_per_s: 50, loss: 0.6 }, regroups: [], events: [],
    load_balancing: { threshold: 0.3, sustain_seconds: 60, migrations: [], loads: { 'server-1': 3_000_000, 'server-2': 1_000_000 }, imbalance: 0.667, inactive: null, capacity_from: 'declared', capacity: null, busy: null },
    sharding: null,
  };
}

test('JobMetrics: batch, progress, event, verdict and status figures come out in Prometheus text format under hetps_ names, and move', async () => {
  let st = status({ pulls: 10, pushes: 5, steps: [10, 8, 2] });
  const m = new JobMetrics({ status: async () => st });
  const batch = (node: string, staleness: number) => ({
    node, batch_id: `b-${node}-${staleness}`, samples: 32, loss: 0.5, redelivered: staleness === 9, ack_confirmed: true, staleness, round: null,
    busy_ms: 3, emulated_step_ms: 40, dropped_stale: staleness === 0, part_dropped: staleness === 3, window: null, group: null,
  });
  m.batch(batch('f1', 0));
  m.batch(batch('f2', 3));
  m.batch({ ...batch('s1', 9), ack_confirmed: false });
  m.progress({ node: 'f1', group: 'fast', steps: 1, samples: 32, loss: 0.5, samples_per_s: 12, round: null, emulated_speed: 1, emulated: true, busy_ms: 3, emulated_step_ms: 40, window_ms: 2000, first_step_ago_ms: 10, bytes_out: 1000, bytes_in: 5000, compression: null, link_utilisation: null, held: ['b-9', 'b-10'], held_count: 2, loop_state: 'training', group_state: 'running.sync.stepping', windows: 3, last_ack_ago_ms: 500 });
  m.event({ at_ms: 1, kind: 'checkpoint', node: null, text: 'ckpt' });
  m.event({ at_ms: 2, kind: 'failover', node: 'server-1', text: 'promoted' });
  m.event({ at_ms: 3, kind: 'migration', node: 'server-2', text: 'shard s1: primary moved server-1 → server-2' });
  m.verdict({ node: 's1', role: 'worker', state: 'dead', since_ms: 1, reason: 'silent', reported: '', silent_ms: 900 });
  m.evaluation({ logloss: 0.45, auc: 0.81 });

  const first = parsePrometheus(await m.text());
  const fam = (text: ReturnType<typeof parsePrometheus>, name: string) => {
    const f = text.find((x) => x.name === name);
    assert.ok(f, `${name} is exposed`);
    return f;
  };
  const value = (text: ReturnType<typeof parsePrometheus>, name: string, labels: Record<string, string> = {}) =>
    Number(fam(text, name).metrics.find((x) => Object.entries(labels).every(([k, v]) => x.labels?.[k] === v))?.value);
  const names = first.map((f) => f.name).filter((n) => n.startsWith('hetps_'));
  assert.ok(names.length >= 12, `${names.length} hetps_ families: ${names.join(', ')}`);
  assert.equal(fam(first, 'hetps_samples_total').type, 'COUNTER');
  assert.equal(value(first, 'hetps_samples_total'), 64, 'an unconfirmed acknowledgement is not counted');
  assert.equal(value(first, 'hetps_batches_acked_total'), 2);
  assert.equal(value(first, 'hetps_worker_samples_total', { node: 'f2' }), 32);
  assert.equal(fam(first, 'hetps_step_seconds').type, 'HISTOGRAM');
  // This parser folds a histogram's labelled series into one: read those from the registry itself.
  const json = await m.registry.getMetricsAsJSON();
  const stepValues = json.find((x) => x.name === 'hetps_step_seconds')!.values as { value: number; labels: Record<string, string | number>; metricName?: string }[];
  assert.equal(stepValues.find((v) => v.metricName === 'hetps_step_seconds_count' && v.labels.node === 'f1')?.value, 1);
  assert.equal(stepValues.find((v) => v.metricName === 'hetps_step_seconds_bucket' && v.labels.node === 'f2' && v.labels.le === 0.025)?.value, 0, 'a 40 ms step is above 25 ms');
  assert.equal(stepValues.find((v) => v.metricName === 'hetps_step_seconds_bucket' && v.labels.node === 'f2' && v.labels.le === 0.05)?.value, 1);
  const stale = fam(first, 'hetps_push_staleness').metrics[0]!;
  assert.equal(Number(stale.buckets?.['0']), 1, 'one push at staleness 0');
  assert.equal(Number(stale.buckets?.['4']), 2, 'and one at 3 (≤ 4)');
  assert.equal(value(first, 'hetps_wire_bytes', { node: 'f1', direction: 'in' }), 5000);
  assert.equal(value(first, 'hetps_worker_held_batches', { node: 'f1' }), 2, 'the batches f1 holds, from its progress telemetry');
  assert.equal(value(first, 'hetps_batches_dropped_stale_total'), 1);
  assert.equal(value(first, 'hetps_batches_part_dropped_total'), 1, 'a batch applied without its dense part or its rows');
  assert.equal(value(first, 'hetps_events_total', { kind: 'checkpoint' }), 1);
  assert.equal(value(first, 'hetps_failovers_total'), 1, 'a load-balancing move is not a failover');
  assert.equal(value(first, 'hetps_events_total', { kind: 'migration' }), 1);
  assert.equal(value(first, 'hetps_server_load', { node: 'server-1' }), 3_000_000);
  assert.equal(value(first, 'hetps_server_load_imbalance'), 0.667);
  assert.equal(value(first, 'hetps_checkpoints_total'), 1);
  assert.equal(value(first, 'hetps_health_state', { node: 's1', role: 'worker' }), 2, 'dead is 2');
  assert.equal(value(first, 'hetps_test_auc'), 0.81);
  assert.equal(value(first, 'hetps_shard_requests_total', { shard: 's0', op: 'pull' }), 10);
  assert.equal(value(first, 'hetps_shard_rows', { shard: 's1' }), 100);
  assert.equal(value(first, 'hetps_group_gap_steps', { group: 'slow' }), 7, 'fast members average 9 steps, slow 2');
  assert.equal(value(first, 'hetps_group_gap_steps', { group: 'fast' }), 0);
  assert.equal(value(first, 'hetps_job_state', { state: 'training' }), 1);
  assert.equal(value(first, 'hetps_job_state', { state: 'paused' }), 0);

  // Training goes on: the counters grow by what the shards served since the last scrape.
  st = status({ pulls: 25, pushes: 9, steps: [14, 12, 3] });
  m.batch(batch('f1', 1));
  const second = parsePrometheus(await m.text());
  assert.equal(value(second, 'hetps_samples_total'), 96);
  assert.equal(value(second, 'hetps_shard_requests_total', { shard: 's0', op: 'pull' }), 25);
  assert.equal(value(second, 'hetps_shard_requests_total', { shard: 's1', op: 'push' }), 9);
  assert.equal(value(second, 'hetps_group_gap_steps', { group: 'slow' }), 10);
  // A job that does not answer leaves the scrape-time figures as they were; the rest still comes out.
  const silent = new JobMetrics({ status: async () => { throw new Error('no answer'); } });
  silent.batch(batch('f1', 0));
  assert.equal(value(parsePrometheus(await silent.text()), 'hetps_samples_total'), 32);
});

test('groupProgress: mean steps per member and the gap to the group furthest ahead', () => {
  const s = status({ pulls: 0, pushes: 0, steps: [4, 6, 1] });
  assert.deepEqual(groupProgress(s), { fast: { steps: 5, gap: 0 }, slow: { steps: 1, gap: 4 } });
  assert.deepEqual(groupProgress({ groups: [], workers: [] }), {});
});

test('deploy/grafana/hetps-dashboard.json: valid JSON whose every query names metrics the monitor serves', async () => {
  const { readFile } = await import('node:fs/promises');
  const dash = JSON.parse(await readFile(new URL('../../deploy/grafana/hetps-dashboard.json', import.meta.url), 'utf8')) as { panels: { title: string; targets: { expr: string }[] }[] };
  const m = new JobMetrics({ status: async () => null });
  const served = new Set((await m.registry.getMetricsAsJSON()).map((x) => x.name));
  assert.ok(dash.panels.length >= 12);
  for (const p of dash.panels) {
    for (const t of p.targets) {
      const names = [...t.expr.matchAll(/\b(hetps_[a-z_]+)/g)].map((x) => x[1]!.replace(/_(bucket|sum|count)$/, ''));
      assert.ok(names.length > 0, `${p.title}: ${t.expr}`);
      for (const n of names) assert.ok(served.has(n), `${p.title}: ${n} is not a metric the monitor serves`);
    }
  }
});
