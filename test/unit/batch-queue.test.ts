import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SimulatedClock, ValidationError } from '../../runtime/mod.ts';
import { decodeDescriptor, encodeDescriptor, memoryBatchQueue, type BatchDescriptor } from '../../actors/store/batch-queue.ts';

const desc = (index: number): BatchDescriptor => ({ batch_id: `src/train/e0/b${index}`, epoch: 0, index, split: 'train', batch_size: 32, samples: 32 });

test('memory batch queue: an unacknowledged batch is delivered again after ack_wait, and the stale delivery can no longer ack it', async () => {
  const clock = new SimulatedClock();
  const q = memoryBatchQueue({ clock, ackWaitMs: 1_000 });
  await q.publish([desc(0), desc(1)]);
  const a = await q.next(0);
  assert.equal(a?.desc.batch_id, 'src/train/e0/b0');
  assert.equal(a!.redelivered, false);
  assert.equal(await q.pending(), 2, 'in flight still counts as pending');

  clock.increment(999);
  const b = await q.next(0);
  assert.equal(b?.desc.batch_id, 'src/train/e0/b1', 'b0 is still held');
  assert.equal(await b!.ack(), true);
  assert.equal(await q.pending(), 1, 'an acknowledged batch leaves the queue');

  clock.increment(1);
  const again = await q.next(0);
  assert.equal(again?.desc.batch_id, 'src/train/e0/b0', 'delivered again once ack_wait ran out');
  assert.equal(again!.redelivered, true);
  assert.equal(again!.deliveries, 2);
  assert.equal(await a!.ack(), false, 'the expired delivery cannot acknowledge');
  assert.equal(await again!.ack(), true);
  assert.equal(await q.pending(), 0);
});

test('memory batch queue: next waits for a publish or a redelivery, else answers null at its timeout; working() and nak() behave', async () => {
  const clock = new SimulatedClock();
  const q = memoryBatchQueue({ clock, ackWaitMs: 1_000 });
  const empty = q.next(500);
  clock.increment(500);
  assert.equal(await empty, null);

  const waiting = q.next(10_000);
  await q.publish([desc(7), desc(7)]);
  const m = await waiting;
  assert.equal(m?.desc.index, 7);
  assert.equal(await q.pending(), 1, 'a batch id published twice is queued once');

  clock.increment(800);
  m!.working();
  clock.increment(800);
  assert.equal(await peek(q, clock), null, 'working() restarted the ack_wait clock');
  m!.nak();
  const n = await q.next(0);
  assert.equal(n?.desc.index, 7, 'nak gives the batch back at once');
  assert.equal(await n!.ack(), true);
  await q.close();
  assert.equal(await q.next(1_000), null, 'a closed queue hands out nothing');
});

async function peek(q: ReturnType<typeof memoryBatchQueue>, clock: SimulatedClock) {
  const p = q.next(1);
  clock.increment(1);
  return p;
}

test('batch descriptors round-trip through msgpack and are validated', () => {
  assert.deepEqual(decodeDescriptor(encodeDescriptor(desc(3))), desc(3));
  assert.throws(() => decodeDescriptor(new Uint8Array([0xc0])), ValidationError);
});
