/**
 * The dashboard's snapshot says how gradients travel: the wire line follows
 * communication.compression as the workers apply it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, connectTransport, silentLogger, systemClock } from '../../runtime/mod.ts';
import { createMonitorActor } from '../../actors/monitor/monitor.actor.ts';
import { JobWatch } from '../../actors/monitor/monitor-http.ts';

for (const [compression, says] of [['fp16', /^fp16 \(gradients in pushes and group slices as scaled halves\)$/], [null, /^none \(gradients are sent uncompressed\)$/]] as const) {
  test(`the snapshot's wire line with compression ${compression ?? 'absent'}: ${says.source}`, async () => {
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
