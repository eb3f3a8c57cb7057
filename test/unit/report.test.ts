/**
 * `hetps report`'s page from a telemetry log: every event of the run, though
 * each snapshot carries only the latest few.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { reportHtml } from '../../cli/report.ts';
import type { Snapshot } from '../../actors/monitor/monitor-http.ts';
import type { JobStatus } from '../../actors/scheduler/scheduler.messages.ts';

function snapshot(at: number, events: JobStatus['events']): Snapshot {
  const status = {
    job: 'j', run_id: 'r1', mode: 'hps', state: 'training', plan_version: 1, groups: [], workers: [], shards: [],
    progress: { samples: at, batches_acked: 0, batches_total: 10, samples_per_s: 0, loss: null }, regroups: [], events,
  } as unknown as JobStatus;
  return {
    job: 'j', at_ms: at, ended: false, status, groups: {}, staleness: [], wire: { bytes_out: 0, bytes_in: 0, compression: 'none' },
    point: { t_s: at / 1000, samples: at, samples_per_s: 0, loss: null, test_loss: null, test_auc: null },
  };
}

test('the report lists every event of the run, once each, oldest first', async () => {
  const pause = { at_ms: 1_000, kind: 'pause', node: null, text: 'pause requested' };
  const resume = { at_ms: 2_000, kind: 'resume', node: null, text: 'resumed' };
  const regroup = { at_ms: 3_000, kind: 'regroup', node: null, text: 'regroup to groups v1' };
  // The last snapshot no longer carries the pause.
  const html = await reportHtml([snapshot(1_500, [pause]), snapshot(2_500, [pause, resume]), snapshot(3_500, [resume, regroup])]);
  const data = JSON.parse(/window\.HETPS_REPORT = (.*);<\/script>/.exec(html)![1]!.replace(/<\\\//g, '</')) as { last: Snapshot };
  assert.deepEqual(data.last.status!.events.map((e) => e.kind), ['pause', 'resume', 'regroup']);
  await assert.rejects(reportHtml([]), /no snapshot/);
});
