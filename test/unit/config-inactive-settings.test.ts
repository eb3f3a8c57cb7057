/**
 * `inactiveSettings`: start-up lists the settings a file sets that no code
 * acts on yet. A setting that works must never be listed (the user would
 * think it ignored); one that does not must be (the user would think it on).
 */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { inactiveSettings, loadConfig, parseConfig, TRAINING_MODES } from '../../topology/mod.ts';
import { SMALL_CLUSTER } from '../support/config.ts';

const FILE = 'job.yaml';

/** Each checked against the code: nothing reads it (or, with a condition, nothing acts on that value). */
const NOT_ACTIVE = [
  'training.sync_initial_params',
  'training.eval_every',
  'training.staleness_tolerance',
  'training.group_lr_scaling',
  'training.max_staleness',
  'communication.backend',
  'fault_tolerance.worker_recovery_timeout',
  'load_balancing.enabled',
  'load_balancing.imbalance_threshold',
  'load_balancing.sustain_seconds',
  'load_balancing.capacity',
  'server.use_gpu',
  'server.gpu_id',
];

const CLUSTER = SMALL_CLUSTER;

/** Every setting set, each to a value that asks for something. */
const EVERYTHING = (mode: string) => `${CLUSTER}training:
  mode: ${mode}
  sync_initial_params: false
  eval_every: 10
  group_lr_scaling: sqrt
${mode === 'bsp' ? '' : '  max_staleness: 4\n  staleness_tolerance: 2\n'}communication: { backend: nccl, compression: adaptive, compression_threshold: 0.3 }
fault_tolerance:
  worker_recovery_timeout: 5
  server_recovery_timeout: 5
  backup_factor: 1
${mode === 'hps' ? '  preheat_backup: true\n  standby_workers: [w9]\n' : ''}  replication: async
  heartbeat_ms: 100
  dead_after_ms: 400
load_balancing: { enabled: true, imbalance_threshold: 0.5, sustain_seconds: 10, capacity: measured }
server: { use_gpu: true, gpu_id: 1 }
checkpoint: { dir: ckpts, every_s: 5, keep: 2, at_end: false, full_every: 4 }
monitoring: { enabled: true, port: 9000 }
logging: { level: debug }
`;

const pathOf = (line: string) => line.slice(0, line.indexOf('='));

describe('inactiveSettings', () => {
  test('the quickstart lists no setting that is active', async () => {
    const quick = await loadConfig('examples/quickstart.yaml');
    const listed = inactiveSettings(quick).map(pathOf);
    assert.deepEqual(listed.filter((p) => !NOT_ACTIVE.includes(p)), [], `listed as not active: ${listed.join(', ')}`);
    for (const active of ['training.max_staleness', 'training.mode', 'training.emulation_reference_step_ms', 'training.random_seed', 'logging.level']) {
      assert.ok(!listed.includes(active), `${active} is active in hps`);
    }
  });

  test('a file that sets everything lists exactly the settings that are not active', () => {
    const listed = inactiveSettings(parseConfig(EVERYTHING('asp'), FILE)).map(pathOf);
    assert.deepEqual(listed, NOT_ACTIVE);
  });

  test('hps enforces max_staleness and staleness_tolerance: not listed there', () => {
    const listed = inactiveSettings(parseConfig(EVERYTHING('hps'), FILE)).map(pathOf);
    assert.deepEqual(listed, NOT_ACTIVE.filter((p) => p !== 'training.max_staleness' && p !== 'training.staleness_tolerance' && p !== 'fault_tolerance.worker_recovery_timeout' && p !== 'training.group_lr_scaling'));
  });

  test('worker_recovery_timeout is active in hps only (the groups\' wait for a silent member); ack_wait_ms in every mode', () => {
    for (const mode of TRAINING_MODES) {
      const listed = inactiveSettings(parseConfig(EVERYTHING(mode), FILE)).map(pathOf);
      assert.equal(listed.includes('fault_tolerance.worker_recovery_timeout'), mode !== 'hps', `${mode}: ${listed.join(', ')}`);
      assert.ok(!listed.includes('fault_tolerance.ack_wait_ms'), `listed in ${mode}: ${listed.join(', ')}`);
    }
  });

  test('standby_workers and preheat_backup (hps) are never listed', () => {
    const listed = inactiveSettings(parseConfig(EVERYTHING('hps'), FILE)).map(pathOf);
    assert.ok(!listed.some((p) => p === 'fault_tolerance.standby_workers' || p === 'fault_tolerance.preheat_backup'), listed.join(', '));
  });

  test('heartbeat_ms and dead_after_ms are never listed', () => {
    for (const mode of TRAINING_MODES) {
      const listed = inactiveSettings(parseConfig(EVERYTHING(mode), FILE)).map(pathOf);
      assert.ok(!listed.some((p) => p === 'fault_tolerance.heartbeat_ms' || p === 'fault_tolerance.dead_after_ms'), `listed in ${mode}: ${listed.join(', ')}`);
    }
  });

  test('compression fp16 and adaptive (fp16 by link utilisation) are active: not listed; compression_threshold only where adaptive does not read it', () => {
    const at = (c: string) => inactiveSettings(parseConfig(`${CLUSTER}communication: { compression: ${c} }\n`, FILE)).map(pathOf);
    assert.deepEqual(at('fp16'), []);
    assert.deepEqual(at('adaptive'), []);
    assert.deepEqual(at('adaptive, compression_threshold: 0.7'), []);
    assert.deepEqual(at('none, compression_threshold: 0.7'), ['communication.compression_threshold']);
    assert.deepEqual(at('fp16, compression_threshold: 0.7'), ['communication.compression_threshold']);
    // compress_pulls follows the gradients' choice: nothing to act on where nothing is ever sent as fp16.
    assert.deepEqual(at('fp16, compress_pulls: true'), []);
    assert.deepEqual(at('adaptive, compress_pulls: true'), []);
    assert.deepEqual(at('none, compress_pulls: true'), ['communication.compress_pulls']);
    assert.deepEqual(at('none, compress_pulls: false'), []);
  });

  test('training.group_update direct is acted on in hps; listed in asp and bsp, saying why', () => {
    const at = (mode: string) => inactiveSettings(parseConfig(`${CLUSTER}training: { mode: ${mode}, group_update: direct }\n`, FILE));
    assert.ok(!at('hps').map(pathOf).includes('training.group_update'));
    for (const mode of ['asp', 'bsp']) {
      const line = at(mode).find((l) => pathOf(l) === 'training.group_update');
      assert.ok(line !== undefined && /asp and bsp workers push their own gradients/.test(line), `${mode}: ${at(mode).join('; ')}`);
    }
  });

  test('load_balancing is acted on with two or more server nodes under sync replication; listed otherwise, saying why', () => {
    const at = (servers: string, rest: string) => inactiveSettings(parseConfig(`cluster:
  worker_groups:
    - name: g1
      nodes: [w1, w2]
  server_nodes: [${servers}]
model: { type: ctr }
data: { source: spam }
load_balancing: { enabled: true, imbalance_threshold: 0.4, sustain_seconds: 20, capacity: measured }
${rest}`, FILE));
    assert.deepEqual(at('s1, s2', ''), []);
    assert.deepEqual(at('s1, s2, s3', 'fault_tolerance: { replication: sync }\n'), []);
    for (const [servers, rest] of [['s1', ''], ['s1, s2', 'fault_tolerance: { replication: async }\n']] as const) {
      const listed = at(servers, rest);
      assert.deepEqual(listed.map(pathOf), ['load_balancing.enabled', 'load_balancing.imbalance_threshold', 'load_balancing.sustain_seconds', 'load_balancing.capacity'], `${servers} ${rest}`);
      assert.match(listed[0]!, /two or more server nodes and fault_tolerance\.replication sync/);
    }
  });

  test('monitoring.token_file is read only with monitoring.auth: token: listed otherwise, saying so', () => {
    const at = (monitoring: string) => inactiveSettings(parseConfig(`${CLUSTER}monitoring: ${monitoring}\n`, FILE));
    assert.deepEqual(at('{ auth: token, token_file: tok.txt }'), []);
    assert.deepEqual(at('{ auth: token }'), []);
    const listed = at('{ token_file: tok.txt }');
    assert.deepEqual(listed.map(pathOf), ['monitoring.token_file']);
    assert.match(listed[0]!, /monitoring\.auth is none: the dashboard asks for no token/);
  });

  test('sharding.warmup_batches is read only with sharding.hotness: listed with hotness false, saying so', () => {
    const at = (sharding: string) => inactiveSettings(parseConfig(`${CLUSTER}sharding: ${sharding}\n`, FILE));
    assert.deepEqual(at('{ warmup_batches: 16 }'), []);
    assert.deepEqual(at('{ hotness: true, warmup_batches: 16 }'), []);
    assert.deepEqual(at('{ hotness: false }'), []);
    const listed = at('{ hotness: false, warmup_batches: 16 }');
    assert.deepEqual(listed.map(pathOf), ['sharding.warmup_batches']);
    assert.match(listed[0]!, /sharding\.warmup_batches=16 \(not active yet: sharding\.hotness is false: no warm-up is read/);
  });

  test('values that ask for nothing are not listed', () => {
    const text = `${CLUSTER}training: { sync_initial_params: true }
communication: { backend: nats, compression: none }
fault_tolerance: { backup_factor: 0, preheat_backup: false }
load_balancing: { enabled: false }
server: { use_gpu: false }
monitoring: { enabled: false }
`;
    assert.deepEqual(inactiveSettings(parseConfig(text, FILE)), []);
  });
});
