import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  actorAddress, actorOpSubject, controlSubject, heartbeatSubject, telemetrySubject, telemetryWildcard, shardSubject, token,
  InvalidSubjectError, TimeoutError, ValidationError, HetpsError, NoRespondersError, fromWire, toWire, isRetryable, registerErrorClass,
} from '../../runtime/mod.ts';

test('subjects follow the documented scheme', () => {
  assert.equal(controlSubject('job1', 'regroup'), 'hps.job1.ctl.regroup');
  assert.equal(telemetrySubject('job1', 'step', 'a100-node-1:8080'), 'hps.job1.tel.step.a100-node-1:8080');
  assert.equal(telemetryWildcard('job1'), 'hps.job1.tel.>');
  assert.equal(telemetryWildcard('job1', 'step'), 'hps.job1.tel.step.*');
  assert.equal(heartbeatSubject('job1', 'n1'), 'hps.job1.hb.n1');
  assert.equal(shardSubject('job1', 'server-1', 'pull'), 'hps.job1.shard.server-1.pull');
  assert.equal(actorOpSubject(actorAddress('j', 'worker', 'w0'), 'step'), 'hps.j.worker.w0.step');
});

test('invalid tokens are rejected naming the token and what it was for', () => {
  for (const bad of ['', 'a.b', 'a b', 'a*', '>', 'tab\there', 'nl\n', 'x'.repeat(129)]) {
    assert.throws(() => token(bad, 'node name'), (e: unknown) => e instanceof InvalidSubjectError && /node name/.test((e as Error).message), JSON.stringify(bad));
  }
  assert.throws(() => controlSubject('my.job', 'x'), /job name "my.job" contains "\."/);
  assert.throws(() => actorAddress('j', 'bogus' as never, 'x'), /unknown actor kind "bogus"/);
  assert.equal(token('a100-node-1:8080'), 'a100-node-1:8080');
});

test('errors survive the wire as their own class, with cause, data and retryability', () => {
  const e = new TimeoutError('no reply', { cause: new ValidationError('inner', { data: { path: 'x' } }), data: { subject: 's' } });
  const back = fromWire(JSON.parse(JSON.stringify(toWire(e))));
  assert.ok(back instanceof TimeoutError);
  assert.equal(back.name, 'TimeoutError');
  assert.equal(back.message, 'no reply');
  assert.deepEqual(back.data, { subject: 's' });
  assert.equal(back.retryable, true);
  assert.ok(back.cause instanceof ValidationError);
  assert.deepEqual((back.cause as ValidationError).data, { path: 'x' });
  assert.equal(isRetryable(back), true);
  assert.equal(isRetryable(new ValidationError('x')), false);
  assert.equal(isRetryable(new NoRespondersError('x')), true);
});

test('an unknown remote error class arrives as HetpsError keeping its name; registered classes round-trip', () => {
  const unknown = fromWire({ name: 'ShardMovedError', message: 'moved', code: 'ERR_MOVED', retryable: true, data: null, cause: null });
  assert.ok(unknown instanceof HetpsError);
  assert.equal(unknown.data?.remoteName, 'ShardMovedError');
  class ShardMovedError extends HetpsError {}
  registerErrorClass(ShardMovedError);
  assert.ok(fromWire(toWire(new ShardMovedError('moved'))) instanceof ShardMovedError);
  const plain = toWire(new RangeError('bad range'));
  assert.equal(plain.name, 'RangeError');
  assert.equal(plain.code, 'ERR_INTERNAL');
});
