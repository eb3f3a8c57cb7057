/**
 * Access control as policy (deploy/auth.ts, topology/nats-roles.ts): each
 * role's subject permissions, the servers' authorization block, the
 * credentials files and how a process picks its login, the config's checks,
 * and how the scheduler names a command's sender. The servers enforcing it
 * are test/integration/secure-mode.test.ts.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  MAX_REPLY_MESSAGES, ROLES, permits, readRoleFile, renderAuthorization, rolePermissions, subjectMatches, writeAuthFiles, type Role,
} from '../../deploy/auth.ts';
import { ConfigError } from '../../runtime/mod.ts';
import { natsConnectionAs, parseConfig } from '../../topology/mod.ts';
import { controlSender } from '../../actors/scheduler/scheduler.actor.ts';
import { SMALL_CLUSTER } from '../support/config.ts';

const J = 'ctr1';
const pub = (role: Role, subject: string, job = J) => permits(rolePermissions(role, job), 'publish', subject);
const sub = (role: Role, subject: string, job = J) => permits(rolePermissions(role, job), 'subscribe', subject);

test('subject patterns match as NATS matches them', () => {
  assert.ok(subjectMatches('a.*.c', 'a.b.c'));
  assert.ok(!subjectMatches('a.*.c', 'a.b.d'));
  assert.ok(!subjectMatches('a.*', 'a.b.c'));
  assert.ok(subjectMatches('a.>', 'a.b.c'));
  assert.ok(!subjectMatches('a.>', 'a'));
  assert.ok(subjectMatches('$JS.API.INFO', '$JS.API.INFO'));
  assert.ok(!subjectMatches('a.b', 'a.b.c'));
});

test('only the operator and the scheduler send control commands', () => {
  for (const cmd of ['shutdown', 'regroup', 'pause', 'resume', 'checkpoint', 'recover', 'status']) {
    const subject = `hps.${J}.ctl.${cmd}`;
    assert.ok(pub('operator', subject), `operator ${cmd}`);
    assert.ok(pub('scheduler', subject), `scheduler ${cmd}`);
    for (const role of ['worker', 'shard', 'monitor'] as const) assert.ok(!pub(role, subject), `${role} may not send ${cmd}`);
  }
  assert.ok(sub('monitor', `hps.${J}.tel.batch.fast-1`), 'the monitor reads telemetry');
  assert.ok(!pub('monitor', `hps.${J}.tel.batch.fast-1`), 'and publishes nothing of the job');
  // Every node hears the shutdown broadcast.
  for (const role of ['worker', 'shard'] as const) assert.ok(sub(role, `hps.${J}.ctl.shutdown`), `${role} hears shutdown`);
});

test('a worker pulls and pushes to shards and talks to its group, but cannot restore or snapshot a shard', () => {
  assert.ok(pub('worker', `hps.${J}.shard.s0@server-1.pull`));
  assert.ok(pub('worker', `hps.${J}.shard.s0@server-1.push`));
  assert.ok(pub('worker', `hps.${J}.shard.s0@server-1.round_expected`), 'a bsp worker lowers a round with a dead mate');
  assert.ok(pub('worker', `hps.${J}.group.fast.slice`));
  assert.ok(pub('worker', `hps.${J}.group.fast@fast-1.slice`));
  assert.ok(pub('worker', `hps.${J}.tel.batch.fast-1`));
  assert.ok(pub('worker', `hps.${J}.hb.fast-1`));
  for (const op of ['restore', 'restore_begin', 'restore_part', 'snapshot', 'freeze', 'take_frozen', 'take_frozen_part', 'write_frozen', 'integrity_part', 'replicate', 'seed_begin', 'seed_part', 'seed_logs', 'seed']) assert.ok(!pub('worker', `hps.${J}.shard.s0@server-1.${op}`), `worker may not ${op}`);
  // Batches from the work queue: its consumer and acks, not the stream's administration.
  assert.ok(pub('worker', `$JS.API.CONSUMER.MSG.NEXT.HPS_${J}_batches.workers`));
  assert.ok(pub('worker', `$JS.ACK.HPS_${J}_batches.workers.1.2.3.4.5`));
  for (const admin of ['STREAM.DELETE', 'STREAM.PURGE', 'STREAM.CREATE']) assert.ok(!pub('worker', `$JS.API.${admin}.HPS_${J}_batches`), `worker may not ${admin}`);
  assert.ok(!pub('worker', `$KV.HPS_${J}_plan.current`), 'the plan is the scheduler\'s to write');
  assert.ok(pub('worker', `$KV.HPS_${J}_profiles.fast-1`), 'a worker writes its own profile');
  // Another job on the same cluster is out of reach.
  assert.ok(!pub('worker', `hps.other.shard.s0@server-1.push`));
  assert.ok(!pub('worker', `$JS.API.CONSUMER.MSG.NEXT.HPS_other_batches.workers`));
});

test('a shard serves its own subjects and replication, and only the scheduler administers the job\'s streams', () => {
  assert.ok(sub('shard', `hps.${J}.shard.s0@server-1.push`));
  assert.ok(pub('shard', `hps.${J}.shard.s0@server-2.replicate`));
  for (const op of ['seed_begin', 'seed_part', 'seed_logs', 'seed']) assert.ok(pub('shard', `hps.${J}.shard.s0@server-2.${op}`), `it seeds a new or restarted replica (${op})`);
  assert.ok(pub('shard', `hps.${J}.scheduler.failover.replica_ready`), 'it tells the failover a seeded replica caught up');
  assert.ok(pub('shard', `hps.${J}.scheduler.failover.replica_unseedable`), '… or that one cannot be seeded');
  assert.ok(!pub('shard', `hps.${J}.ctl.regroup`), 'but sends the scheduler no command');
  assert.ok(!pub('shard', `hps.${J}.shard.s0@server-2.push`), 'a shard does not train');
  assert.ok(!sub('shard', `hps.${J}.group.fast.slice`));
  assert.ok(!sub('worker', `hps.${J}.shard.s0@server-1.push`), 'a worker does not listen on shard subjects');
  assert.ok(pub('scheduler', `$JS.API.STREAM.CREATE.HPS_${J}_batches`));
  assert.ok(pub('scheduler', `$JS.API.STREAM.CREATE.KV_HPS_${J}_plan`));
  assert.ok(!pub('scheduler', `$JS.API.STREAM.CREATE.HPS_other_batches`), 'a job\'s scheduler administers its own streams only');
});

test('a server node\'s own shard user serves only the replicas on that node', async () => {
  const scoped = rolePermissions('shard', J, { node: 'server-1', shards: ['server-1', 'server-2'] });
  assert.ok(permits(scoped, 'subscribe', `hps.${J}.shard.server-1@server-1.push`), 'its primary');
  assert.ok(permits(scoped, 'subscribe', `hps.${J}.shard.server-2@server-1.replicate`), 'a backup of another shard placed on it');
  assert.ok(!permits(scoped, 'subscribe', `hps.${J}.shard.server-1@server-2.push`), 'not the replica on another node');
  assert.ok(!permits(scoped, 'subscribe', `hps.${J}.shard.>`));
  assert.ok(permits(scoped, 'publish', `hps.${J}.shard.server-1@server-2.replicate`), 'it replicates to its backups');
  const dir = await mkdtemp(join(tmpdir(), 'hetps-auth-'));
  try {
    const files = await writeAuthFiles(dir, J, { serverNodes: ['server-1', 'server-2'] });
    assert.deepEqual(Object.keys(files.servers).sort(), ['server-1', 'server-2']);
    const own = readRoleFile(files.servers['server-2']!);
    assert.deepEqual([own.role, own.user, own.node], ['shard', 'shard-server-2', 'server-2']);
    assert.ok(files.authorization.includes(`user: "shard-server-2"`));
    // A server process of a secure job logs in as its node's user; a node without one, as the role.
    const secure = parseConfig(`${SMALL_CLUSTER}nats:\n  servers: [nats://a:4222]\n  secure: true\n  auth_dir: ${files.dir}\n`, 's.yaml');
    assert.equal(natsConnectionAs(secure, 'shard', null, 'server-2').auth?.nkeySeed, own.nkey_seed);
    assert.equal(natsConnectionAs(secure, 'shard', null, 'server-9').auth?.nkeySeed, readRoleFile(files.roles.shard).nkey_seed);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('JetStream is granted per operation and stream, never $JS.>; replies through allow_responses', () => {
  for (const job of [J, '*']) {
    for (const role of ROLES) {
      const p = rolePermissions(role, job);
      for (const s of [...p.publish.allow, ...p.subscribe.allow]) {
        assert.ok(!['>', '$JS.>', '$JS.API.>', '$KV.>', 'hps.>'].includes(s), `${role} (${job}) is granted ${s}`);
        assert.ok(!/^\$JS\.API\.[A-Z]+\.>$/.test(s), `${role} (${job}) is granted a whole JetStream API family: ${s}`);
      }
    }
  }
  assert.ok(rolePermissions('worker', J).allow_responses && rolePermissions('shard', J).allow_responses);
  assert.ok(!rolePermissions('operator', J).allow_responses, 'an operator answers no requests');
  // With no job named, every job's subjects, and still no whole-API grant.
  assert.ok(pub('worker', 'hps.anyjob.shard.s0@n.push', '*'));
  assert.ok(!pub('worker', 'hps.anyjob.ctl.shutdown', '*'));
  assert.throws(() => rolePermissions('worker', 'a.b'), /job name/);
});

test('the authorization block: every role as user/password and as nkey, replies sized for chunks, no anonymous user', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-auth-'));
  try {
    const files = await writeAuthFiles(dir, J);
    assert.equal(files.dir, join(dir, 'auth'));
    for (const role of ROLES) {
      const file = files.roles[role];
      assert.equal((await stat(file)).mode & 0o777, 0o600, `${file} is 0600`);
      const c = readRoleFile(file);
      assert.equal(c.role, role);
      assert.equal(c.job, J);
      assert.ok(files.authorization.includes(`user: "${role}", password: "${c.password}"`), `${role} by password`);
      assert.ok(files.authorization.includes(`nkey: "${c.nkey_public}"`), `${role} by nkey`);
      assert.equal((await readFile(join(dir, 'auth', `${role}.nk`), 'utf8')).trim(), c.nkey_seed);
    }
    assert.equal(await readFile(join(dir, 'auth', 'authorization.conf'), 'utf8'), files.authorization);
    assert.match(files.authorization, new RegExp(`allow_responses: \\{ max: ${MAX_REPLY_MESSAGES} \\}`));
    assert.doesNotMatch(files.authorization, /no_auth_user/);
    // Fresh credentials each time.
    const again = await writeAuthFiles(join(dir, 'again'), J);
    assert.notEqual(readRoleFile(again.roles.worker).password, readRoleFile(files.roles.worker).password);
    assert.equal(renderAuthorization([]).includes('users: ['), true);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('a credentials file that is not one is refused, naming what is wrong', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-auth-'));
  try {
    const files = await writeAuthFiles(dir, null);
    const good = JSON.parse(await readFile(files.roles.operator, 'utf8')) as Record<string, unknown>;
    const write = async (name: string, v: unknown) => { const f = join(dir, name); await writeFile(f, typeof v === 'string' ? v : JSON.stringify(v)); return f; };
    assert.throws(() => readRoleFile(join(dir, 'missing.json')), (e: Error) => e instanceof ConfigError && /missing\.json: cannot read it \(ENOENT/.test(e.message));
    const bad = await write('bad.json', '{nope');
    assert.throws(() => readRoleFile(bad), /bad\.json: not JSON/);
    const noSeed = await write('noseed.json', { ...good, nkey_seed: undefined });
    assert.throws(() => readRoleFile(noSeed), /missing nkey_seed/);
    const badSeed = await write('badseed.json', { ...good, nkey_seed: 'SUNOTASEED' });
    assert.throws(() => readRoleFile(badSeed), /nkey_seed is not a valid user seed/);
    const badRole = await write('badrole.json', { ...good, role: 'admin' });
    assert.throws(() => readRoleFile(badRole), /unknown role "admin"/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('each process logs in as its role when the config is secure, with its own login otherwise', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-auth-'));
  const base = SMALL_CLUSTER;
  try {
    const files = await writeAuthFiles(dir, null);
    const open = parseConfig(`${base}nats:\n  servers: [nats://a:4222]\n  user: u\n  pass: p\n`, 'open.yaml');
    const plain = natsConnectionAs(open, 'worker');
    assert.equal(plain.auth?.user, 'u');
    assert.equal(plain.role, null);
    const secure = parseConfig(`${base}nats:\n  servers: [nats://a:4222]\n  secure: true\n  auth_dir: ${files.dir}\n`, 'secure.yaml');
    for (const role of ['worker', 'shard', 'scheduler', 'operator'] as const) {
      const c = natsConnectionAs(secure, role);
      assert.equal(c.role, role);
      assert.equal(c.auth?.nkeySeed, readRoleFile(files.roles[role]).nkey_seed, `${role} logs in with its own nkey`);
      assert.equal(c.auth?.user, null);
    }
    // A run's own directory wins over nats.auth_dir; `<dir>` or `<dir>/auth` both work.
    const other = await writeAuthFiles(join(dir, 'run'), 'job1');
    assert.equal(natsConnectionAs(secure, 'worker', join(dir, 'run')).auth?.nkeySeed, readRoleFile(other.roles.worker).nkey_seed);
    const local = parseConfig(`${base}nats:\n  secure: true\n`, 'local.yaml');
    assert.throws(() => natsConnectionAs(local, 'worker'), /no credentials for role worker: give nats.auth_dir/);
    assert.throws(() => natsConnectionAs(secure, 'worker', join(dir, 'nowhere')), /no credentials for role worker under .*nowhere/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('the config refuses secure settings that cannot work, naming the key', () => {
  const base = SMALL_CLUSTER;
  assert.throws(() => parseConfig(`${base}nats:\n  secure: true\n  user: u\n  pass: p\n`, 'a.yaml'), /nats\.secure[\s\S]*remove user\/pass/);
  assert.throws(() => parseConfig(`${base}nats:\n  secure: true\n  servers: [nats://a:4222]\n`, 'b.yaml'), /nats\.secure with nats\.servers needs nats\.auth_dir/);
  assert.throws(() => parseConfig(`${base}nats:\n  auth_dir: /x\n`, 'c.yaml'), /nats\.auth_dir only applies with nats\.secure: true/);
  assert.throws(() => parseConfig(`${base}nats:\n  secure: yes please\n`, 'd.yaml'), /nats\.secure/);
  const ok = parseConfig(`${base}nats:\n  secure: true\n`, 'e.yaml');
  assert.equal(ok.nats.secure, true);
  assert.equal(ok.nats.auth_dir, null);
});

test('a control command\'s sender, as the scheduler logs it', () => {
  const self = 'driver#abc';
  assert.equal(controlSender(self, self, true), 'scheduler (this driver)');
  assert.equal(controlSender('driver#other', self, true), 'scheduler (another driver)');
  assert.equal(controlSender('ctl#x1', self, true), 'operator');
  assert.equal(controlSender('json-client', self, true), 'operator');
  assert.equal(controlSender('json-client', self, false), 'unauthenticated client (nats.secure is off)');
});
