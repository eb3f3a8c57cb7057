/**
 * A group member's mailbox refuses a message of another membership (run id
 * `<run>/g<version>`) with a retryable error instead of answering it: while
 * a member re-forms, its old and new mailboxes share one address, and a
 * sender told "taken" by the old one would never send it to the new one.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ActorSystem, InProcessBroker, SeededRandom, Transport, isRetryable, systemClock } from '../../runtime/mod.ts';
import { createGroupMemberActor } from '../../actors/group/group-sync.ts';

test('a message of another membership is refused (retryable), one of its own is handed over', async () => {
  const broker = new InProcessBroker();
  const mk = (node: string) => new ActorSystem({
    transport: new Transport(broker.client(), { clientId: node, clock: systemClock }), job: 'gm', node, clock: systemClock, random: new SeededRandom(1), defaultRequestTimeoutMs: 2_000,
  });
  const a = mk('w1');
  const b = mk('w2');
  const joined: string[] = [];
  const sink = { slice: () => undefined, part: () => undefined, pushed: () => undefined, progress: () => undefined, close: () => undefined, own: () => undefined, join: (m: string) => { joined.push(m); } };
  await a.spawn(createGroupMemberActor({ group: 'g1', member: 'w1', runId: 'run/g1', sink }));
  try {
    const ref = b.ref('group', 'g1@w1');
    await assert.rejects(ref.request('join', { run_id: 'run', member: 'w2' }, { retries: 0 }),
      (e: unknown) => isRetryable(e) && /serves membership run\/g1, not run: it is re-forming; send again/.test((e as Error).message));
    assert.deepEqual(joined, [], 'nothing of the other membership reached the member');
    await ref.request('join', { run_id: 'run/g1', member: 'w2' });
    assert.deepEqual(joined, ['w2']);
  } finally {
    await a.stop();
    await b.stop();
  }
});
