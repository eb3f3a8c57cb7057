/**
 * The dashboard's snapshot says how gradients travel: the wire line follows
 * communication.compression as the workers apply it, and with adaptive also
 * the workers' current choices from their progress telemetry.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, connectTransport, silentLogger, systemClock } from '../../runtime/mod.ts';
import type { GradientCompressionSetting } from '../../topology/mod.ts';
import { createMonitorActor } from '../../actors/monitor/monitor.actor.ts';
import { JobWatch } from '../../actors/monitor/monitor-http.ts';
import { publishTelemetry, type ProgressTelemetry } from '../../actors/monitor/telemetry.ts';

const ADAPTIVE_LINE = /^adaptive: fp16 above 50 % link utilisation \(float32 again below 40 %\)$/;

for (const [compression, says] of [
  [{ mode: 'fp16', threshold: 0.5 }, /^fp16 \(gradients in pushes and group slices as scaled halves\)$/],
  [{ mode: null, threshold: 0.5 }, /^none \(gradients are sent uncompressed\)$/],
  [null, /^none \(gradients are sent uncompressed\)$/],
  [{ mode: 'adaptive', threshold: 0.5 }, ADAPTIVE_LINE],
] as const satisfies readonly (readonly [GradientCompressionSetting | null, RegExp])[]) {
  test(`the snapshot's wire line with compression ${compression === null ? 'absent' : compression.mode ?? 'none'}: ${says.source}`, async () => {
    const transport = await connectTransport({ servers: null, broker: new InProcessBroker(), name: 'driver' });
    const monitor = createMonitorActor({ transport, job: 'j', clock: systemClock, log: silentLogger() });
    const watch = new JobWatch({ job: 'j', transport, monitor, everyMs: 60_000, compression });
    try {
      await watch.end();
      assert.ok(watch.latest !== null, 'a last snapshot was made');
      assert.match(watch.latest.wire.compression, says);
    } finally {
      await transport.close();
    }
  });
}

test('adaptive: the wire line counts the workers whose latest progress telemetry says they send fp16', async () => {
  const transport = await connectTransport({ servers: null, broker: new InProcessBroker(), name: 'driver' });
  const monitor = createMonitorActor({ transport, job: 'j', clock: systemClock, log: silentLogger() });
  const watch = new JobWatch({ job: 'j', transport, monitor, everyMs: 60_000, compression: { mode: 'adaptive', threshold: 0.3 } });
  const progress = (node: string, compression: ProgressTelemetry['compression'], link_utilisation: number | null): ProgressTelemetry => ({
    node, group: 'g', steps: 1, samples: 32, loss: 0.5, samples_per_s: 10, round: null, emulated_speed: null, emulated: false,
    busy_ms: 1, emulated_step_ms: 1, window_ms: 2000, first_step_ago_ms: 10, bytes_out: 0, bytes_in: 0, compression, link_utilisation,
    held: null, held_count: null, loop_state: null, group_state: null, windows: null, last_ack_ago_ms: null,
  });
  try {
    publishTelemetry(transport, 'j', 'progress', 'w1', progress('w1', 'none', 0.9));
    publishTelemetry(transport, 'j', 'progress', 'w2', progress('w2', 'none', 0.1));
    publishTelemetry(transport, 'j', 'progress', 'w1', progress('w1', 'fp16', 0.9));
    publishTelemetry(transport, 'j', 'progress', 'w3', progress('w3', null, null));
    await transport.flush();
    await watch.end();
    assert.equal(watch.latest!.wire.compression,
      'adaptive: fp16 above 30 % link utilisation (float32 again below 24 %); now fp16 on 1 of 2 workers', 'w1\'s latest choice counts; w3 did not report one');
  } finally {
    await transport.close();
  }
});
