/**
 * Access control (nats.secure) during the quick start on its own secure
 * local NATS cluster, checked with raw nats.js clients (no hetps code) and
 * `hetps ctl`:
 *
 * - every role's credentials are written, mode 0600, with a user/password
 *   and an nkey seed;
 * - an anonymous connection, and a wrong password, are refused;
 * - with the worker's user/password, publishing `ctl.shutdown`, `ctl.regroup`,
 *   `shard.*.restore` or `shard.*.snapshot` is a permissions violation, and
 *   the job goes on unaffected (every batch acknowledged once, no shutdown);
 * - the monitor user reads telemetry and sends no control command;
 * - the operator's credentials regroup the job (`hetps ctl regroup --auth`),
 *   and the driver logs the command with its sender's role.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { connect, type NatsConnection } from '@nats-io/transport-node';
import { headers } from '@nats-io/nats-core';
import { ROOT, explainExit, hetps, tempDirForFile } from '../support/ps.ts';
import { until } from '../support/until.ts';

const tempDir = tempDirForFile('hetps-secure-');
const ROLES = ['scheduler', 'worker', 'shard', 'operator', 'monitor'];
const json = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
const jsonHeaders = () => { const h = headers(); h.set('Content-Type', 'application/json'); return h; };

/** Every error the server reports on this connection (permissions violations arrive asynchronously). */
function errorsOf(nc: NatsConnection): string[] {
  const out: string[] = [];
  void (async () => {
    for await (const s of nc.status()) if (s.type === 'error') out.push(String((s as { error?: Error }).error?.message ?? ''));
  })();
  return out;
}

test('nats.secure: anonymous refused, a worker\'s credentials cannot steer the job, the operator\'s can', { timeout: 420_000 }, async (t) => {
  const quick = parse(await readFile(join(ROOT, 'examples', 'quickstart.yaml'), 'utf8')) as Record<string, Record<string, unknown>>;
  const job = `secure${process.pid}`;
  quick.job = { name: job, run_dir: join(tempDir(), 'runs') };
  quick.nats = { secure: true };
  quick.data = { ...quick.data, epochs: 6 };
  const cfg = join(tempDir(), 'quickstart.yaml');
  await writeFile(cfg, stringify(quick));
  const up = hetps(['up', '--config', cfg, '--monitor-port', '0', '--summary', join(tempDir(), 'summary.json')], { timeoutMs: 400_000 });
  const conns: NatsConnection[] = [];
  try {
    await until(() => /access control: .* Credentials in \S+;/.test(up.stderr()), 'the secure cluster and its credentials', 90_000, () => up.stderr().slice(-3000));
    const authDir = /Credentials in (\S+);/.exec(up.stderr())![1]!;
    const servers = /NATS cluster up: (\S+)/.exec(up.stderr())![1]!.split(',');

    // ---- the credentials: one file per role, secret, both ways of logging in.
    const creds: Record<string, { user: string; password: string; nkey_seed: string; role: string }> = {};
    for (const role of ROLES) {
      const file = join(authDir, `${role}.json`);
      assert.equal((await stat(file)).mode & 0o777, 0o600, `${file} is mode 0600`);
      creds[role] = JSON.parse(await readFile(file, 'utf8'));
      assert.equal(creds[role]!.role, role);
      assert.match(creds[role]!.nkey_seed, /^SU[A-Z2-7]+$/, 'an nkey user seed');
      assert.ok(creds[role]!.password.length >= 24);
    }

    // Each server node has a user of its own (only the replicas on it).
    for (const node of ['server-1', 'server-2']) assert.equal((JSON.parse(await readFile(join(authDir, `shard-${node}.json`), 'utf8')) as { node: string }).node, node);

    // ---- anonymous and a wrong password: refused.
    await assert.rejects(connect({ servers, reconnect: false }), /Authorization Violation/i, 'an anonymous connection is refused');
    await assert.rejects(connect({ servers, reconnect: false, user: 'worker', pass: 'not-the-password' }), /Authorization Violation/i, 'a wrong password is refused');

    // ---- the operator, through the CLI: the job is training.
    const ctl = (args: string[]) => hetps(['ctl', ...args, '--auth', join(authDir, 'operator.json'), '--nats', servers.join(','), '--job', job, '--json'], { timeoutMs: 60_000 }).exited;
    await until(async () => {
      const r = await ctl(['status']);
      return r.code === 0 && (JSON.parse(r.stdout) as { state: string }).state === 'training';
    }, 'the job to be training (hetps ctl status with the operator\'s credentials)', 120_000, () => up.stderr().slice(-3000));

    // ---- the worker's user/password in a raw client: no control command, no shard restore or snapshot.
    const worker = await connect({ servers, user: creds.worker!.user, pass: creds.worker!.password });
    conns.push(worker);
    const workerErrors = errorsOf(worker);
    worker.publish(`hps.${job}.ctl.shutdown`, json({ reason: 'a worker tries to stop the job' }), { headers: jsonHeaders() });
    await assert.rejects(worker.request(`hps.${job}.ctl.regroup`, json({ groups: null, reason: 'a worker tries to regroup' }), { timeout: 10_000, headers: jsonHeaders() }),
      new RegExp(`Permissions Violation for Publish to "hps\\.${job}\\.ctl\\.regroup"`));
    worker.publish(`hps.${job}.shard.server-1@server-1.restore`, json({ state: null }), { headers: jsonHeaders() });
    worker.publish(`hps.${job}.shard.server-1@server-1.snapshot`, json({}), { headers: jsonHeaders() });
    await worker.flush();
    for (const subject of [`hps.${job}.ctl.shutdown`, `hps.${job}.shard.server-1@server-1.restore`, `hps.${job}.shard.server-1@server-1.snapshot`]) {
      await until(() => workerErrors.some((e) => e.includes(`Permissions Violation for Publish to "${subject}"`)), `a permissions violation for ${subject}`, 10_000, () => workerErrors.join('\n'));
    }
    t.diagnostic(`worker user: ${workerErrors.length} permissions violations reported`);

    // ---- the monitor user: telemetry yes, control commands (not even status) no.
    const monitor = await connect({ servers, user: creds.monitor!.user, pass: creds.monitor!.password });
    conns.push(monitor);
    const heard = monitor.subscribe(`hps.${job}.tel.>`, { max: 1 });
    for await (const m of heard) assert.match(m.subject, new RegExp(`^hps\\.${job}\\.tel\\.`));
    for (const cmd of ['status', 'pause']) {
      await assert.rejects(monitor.request(`hps.${job}.ctl.${cmd}`, json({}), { timeout: 10_000, headers: jsonHeaders() }), /Permissions Violation for Publish/, `the monitor user cannot send ${cmd}`);
    }
    // The operator's user/password, from a raw client: any NATS client in any language can steer the job.
    const operator = await connect({ servers, user: creds.operator!.user, pass: creds.operator!.password });
    conns.push(operator);
    const st = JSON.parse(new TextDecoder().decode((await operator.request(`hps.${job}.ctl.status`, json({}), { timeout: 10_000, headers: jsonHeaders() })).data)) as { result: { job: string } };
    assert.equal(st.result.job, job, 'the operator user reads the status');

    // ---- the operator regroups: slow-1 joins the fast group.
    const groups = [
      { name: 'fast', nodes: ['fast-1', 'fast-2', 'fast-3', 'slow-1'], sync_mode: 'sync', sync_steps: 2 },
      { name: 'slow', nodes: ['slow-2'], sync_mode: 'sync', sync_steps: 4 },
    ];
    const rg = await ctl(['regroup', JSON.stringify({ groups, reason: 'operator test' })]);
    assert.equal(rg.code, 0, explainExit(rg));
    const reply = JSON.parse(rg.stdout) as { accepted: boolean; groups_version: number };
    assert.equal(reply.accepted, true, rg.stdout);
    assert.ok(reply.groups_version >= 1, rg.stdout);
    await until(() => /control command regroup from operator \(/.test(up.stderr()), 'the driver to log the regroup with its sender', 10_000, () => up.stderr().slice(-2000));

    // ---- the job: unaffected by the worker's attempts, to its end.
    const r = await up.exited;
    assert.equal(r.code, 0, explainExit(r));
    assert.doesNotMatch(r.stderr, /a worker tries to/, 'no command of the worker user reached the scheduler');
    const s = JSON.parse(await readFile(join(tempDir(), 'summary.json'), 'utf8')) as { batches: number; batches_acked: number; duplicate_acks: number; regroups: unknown[] };
    assert.equal(s.batches_acked, s.batches, 'every batch acknowledged');
    assert.equal(s.duplicate_acks, 0);
    // No process of the job was refused anything: every subject it uses is granted to its role.
    const runDir = /summary: (\S+)\/summary\.json/.exec(r.stderr)?.[1] ?? /run dir (\S+)/.exec(r.stderr)![1]!;
    for (const n of ['n1', 'n2', 'n3']) {
      const log = await readFile(join(runDir, 'nats', n, 'nats.log'), 'utf8');
      const violations = log.split('\n').filter((l) => /Violation/.test(l) && !/"worker"|"monitor"|Authorization Violation/.test(l));
      assert.deepEqual(violations, [], `nats ${n}: no violation by the job's own processes`);
    }
  } finally {
    for (const c of conns) await c.close().catch(() => undefined);
    up.kill('SIGKILL');
    await up.exited;
  }
});

test('hetps nats up --secure --job: credentials per role for one job, anonymous refused, a running cluster\'s credentials never replaced', { timeout: 120_000 }, async () => {
  const dir = join(tempDir(), 'nats');
  const upCmd = (args: string[]) => hetps(['nats', 'up', '--dir', dir, '--port', '0', '--nodes', '1', ...args], { timeoutMs: 60_000 }).exited;
  const misuse = await upCmd(['--job', 'j1']);
  assert.equal(misuse.code, 2);
  assert.match(misuse.stderr, /--job only applies with --secure/);
  const started = await upCmd(['--secure', '--job', 'j1', '--json']);
  assert.equal(started.code, 0, explainExit(started));
  const conns: NatsConnection[] = [];
  try {
    const desc = JSON.parse(started.stdout) as { urls: string[]; secure: { auth_dir: string; job: string; roles: Record<string, string> } };
    assert.equal(desc.secure.job, 'j1');
    assert.deepEqual(Object.keys(desc.secure.roles).sort(), [...ROLES].sort());
    const servers = desc.urls;
    await assert.rejects(connect({ servers, reconnect: false }), /Authorization Violation/i);
    const w = JSON.parse(await readFile(desc.secure.roles.worker!, 'utf8')) as { user: string; password: string };
    const worker = await connect({ servers, user: w.user, pass: w.password });
    conns.push(worker);
    const errors = errorsOf(worker);
    worker.publish('hps.j1.shard.s0@n1.push', json({}));
    worker.publish('hps.j1.ctl.pause', json({}));
    worker.publish('hps.other.shard.s0@n1.push', json({}));
    await worker.flush();
    await until(() => errors.length >= 2, 'the violations', 10_000, () => errors.join('\n'));
    await new Promise((r) => setTimeout(r, 300));
    assert.ok(!errors.some((e) => e.includes('"hps.j1.shard.s0@n1.push"')), `a push to a shard of its job is allowed: ${errors.join('; ')}`);
    assert.ok(errors.some((e) => e.includes('"hps.j1.ctl.pause"')), 'no control command');
    assert.ok(errors.some((e) => e.includes('"hps.other.shard.s0@n1.push"')), 'another job is out of reach');
    // The operator's nkey (the seed file) logs in as hetps' own clients do.
    const op = JSON.parse(await readFile(desc.secure.roles.operator!, 'utf8')) as { nkey_seed: string };
    const { nkeyAuthenticator } = await import('@nats-io/nats-core');
    const operator = await connect({ servers, authenticator: nkeyAuthenticator(new TextEncoder().encode(op.nkey_seed)) });
    conns.push(operator);
    await operator.flush();
    // A second start on the same directory is refused before any credentials are written.
    const before = await readFile(desc.secure.roles.worker!, 'utf8');
    const again = await upCmd(['--secure']);
    assert.equal(again.code, 2);
    assert.match(again.stderr, /already running/);
    assert.equal(await readFile(desc.secure.roles.worker!, 'utf8'), before, 'the running cluster\'s credentials are untouched');
  } finally {
    for (const c of conns) await c.close().catch(() => undefined);
    await hetps(['nats', 'down', '--dir', dir], { timeoutMs: 30_000 }).exited;
  }
});
