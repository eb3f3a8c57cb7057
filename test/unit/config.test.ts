import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError } from '../../runtime/errors.ts';
import {
  allWorkerNodes, heldBandwidthMbps, inactiveSettings, loadConfig, tcLinkedNodes, natsConnection, nodeOverrides, parseConfig, serverNodes, standbyWorkerNodes,
  type ConfigIssue, type HetpsConfig,
} from '../../topology/mod.ts';
import { SMALL_CLUSTER } from '../support/config.ts';
import { modelAndData, stalenessPolicyFromConfig } from '../../actors/node/nodes.ts';
import { shardPlanFromConfig } from '../../actors/node/config-bridge.ts';

const FILE = 'job.yaml';

/** The reference article's config, as the brief quotes it. */
const ARTICLE = `cluster:
  worker_groups:
    - name: a100_group
      nodes: ["a100-node-1:8080", "a100-node-2:8080"]
      sync_mode: sync
      sync_steps: 4
    - name: cpu_group
      nodes: ["cpu-node-1:8080"]
      sync_mode: async
  server_nodes: ["server-1:9090", "server-2:9090"]
communication: { backend: auto, compression: adaptive, compression_threshold: 0.5 }
fault_tolerance: { worker_recovery_timeout: 30, server_recovery_timeout: 60, backup_factor: 1 }
training: { random_seed: 42, sync_initial_params: true }
server: { use_gpu: false }
`;

const MODEL_AND_DATA = `model: { type: ctr }
data: { source: spam }
`;

/** A small valid config the failing examples start from. */
const BASE = SMALL_CLUSTER;

function issuesOf(text: string, file = FILE): { error: ConfigError; issues: ConfigIssue[] } {
  try {
    parseConfig(text, file);
  } catch (e) {
    assert.ok(e instanceof ConfigError, `expected a ConfigError, got ${String(e)}`);
    const issues = (e.data as { issues: ConfigIssue[] }).issues;
    assert.ok(Array.isArray(issues) && issues.length > 0, 'ConfigError.data.issues lists the problems');
    return { error: e, issues };
  }
  assert.fail('expected the config to be rejected');
}

/** 1-based line of the first line of `text` that contains `needle`. */
function lineOf(text: string, needle: string, nth = 1): number {
  let seen = 0;
  const lines = text.split('\n');
  for (let i = 0; i < lines.length; i++) {
    if (lines[i]!.includes(needle) && ++seen === nth) return i + 1;
  }
  throw new Error(`${JSON.stringify(needle)} is not in the text`);
}

/**
 * Asserts the config is rejected with an issue at `path` whose message has
 * every one of `words`, on `line`; the error message shows it as
 * `file:line:col: path: …`.
 */
function expectIssue(text: string, want: { path: string; words: string[]; line: number | null; column?: number }): ConfigIssue {
  const { error, issues } = issuesOf(text);
  const issue = issues.find((i) => i.path === want.path && want.words.every((w) => i.message.includes(w)));
  assert.ok(issue, `no issue at ${want.path} with ${JSON.stringify(want.words)}; got:\n${error.message}`);
  assert.equal(issue.line, want.line, `line of ${want.path}: ${error.message}`);
  if (want.column !== undefined) assert.equal(issue.column, want.column, `column of ${want.path}`);
  const where = issue.line === null ? `${FILE}: ` : `${FILE}:${issue.line}:${issue.column}: `;
  assert.ok(error.message.includes(`${where}${issue.path ? `${issue.path}: ` : ''}${issue.message}`), `message shows the issue in place:\n${error.message}`);
  return issue;
}

function parse(text: string): HetpsConfig {
  return parseConfig(text, FILE);
}

// ---------------------------------------------------------------- accepted configs

describe('accepted configs', () => {
  test('the reference article config parses as written (with the model and data hetps needs)', () => {
    const c = parse(ARTICLE + MODEL_AND_DATA);
    assert.deepEqual(c.cluster.worker_groups.map((g) => [g.name, g.nodes, g.sync_mode, g.sync_steps]), [
      ['a100_group', ['a100-node-1:8080', 'a100-node-2:8080'], 'sync', 4],
      ['cpu_group', ['cpu-node-1:8080'], 'async', null],
    ]);
    assert.deepEqual(c.cluster.server_nodes, ['server-1:9090', 'server-2:9090']);
    assert.deepEqual(c.communication, { backend: 'auto', compression: 'adaptive', compression_threshold: 0.5, compress_pulls: false, max_message_bytes: 1024 ** 3 });
    assert.equal(c.fault_tolerance.worker_recovery_timeout, 30);
    assert.equal(c.fault_tolerance.server_recovery_timeout, 60);
    assert.equal(c.fault_tolerance.backup_factor, 1);
    assert.equal(c.training.random_seed, 42);
    assert.equal(c.training.sync_initial_params, true);
    assert.equal(c.server.use_gpu, false);
  });

  test('the article config alone is missing only the hetps sections model and data', () => {
    const { issues } = issuesOf(ARTICLE);
    assert.deepEqual(issues.map((i) => [i.path, i.message]), [['model', 'is required'], ['data', 'is required']]);
    assert.equal(issues[0]!.line, null);
  });

  test('the other keys the article documents are accepted with its names', () => {
    const c = parse(BASE + `server: { use_gpu: true, gpu_id: 0 }
fault_tolerance: { preheat_backup: true, standby_workers: [w9], replication: async }
logging: { level: WARNING }
monitoring: { port: 8888 }
load_balancing: { imbalance_threshold: 0.3, sustain_seconds: 60 }
`);
    assert.deepEqual(c.server, { use_gpu: true, gpu_id: 0 });
    assert.equal(c.fault_tolerance.preheat_backup, true);
    assert.deepEqual(c.fault_tolerance.standby_workers, ['w9']);
    assert.equal(c.fault_tolerance.replication, 'async');
    assert.equal(c.logging.level, 'warn');
    assert.equal(c.monitoring.port, 8888);
  });

  test('every sync_mode the article describes, each with its own setting', () => {
    const c = parse(`cluster:
  worker_groups:
    - { name: a, nodes: [a1], sync_mode: sync, sync_steps: 8 }
    - { name: b, nodes: [b1], sync_mode: adaptive, adaptive_threshold: 3 }
    - { name: c, nodes: [c1], sync_mode: accumulation, accumulation_steps: 2 }
    - { name: d, nodes: [d1], sync_mode: async }
    - { name: e, nodes: [e1] }
  server_nodes: [s1]
${MODEL_AND_DATA}`);
    assert.deepEqual(c.cluster.worker_groups.map((g) => [g.sync_mode, g.sync_steps, g.adaptive_threshold, g.accumulation_steps]), [
      ['sync', 8, null, null],
      ['adaptive', null, 3, null],
      ['accumulation', null, null, 2],
      ['async', null, null, null],
      ['sync', 4, null, null],
    ]);
  });

  test('cluster.shards_per_server: 1 by default; a positive integer up to 64, an error naming it otherwise; the plan has that many shards per server', () => {
    assert.equal(parse(BASE).cluster.shards_per_server, 1);
    const c = parse(BASE.replace('  server_nodes: [s1, s2]\n', '  server_nodes: [s1, s2]\n  shards_per_server: 2\n'));
    assert.equal(c.cluster.shards_per_server, 2);
    const md = modelAndData(c);
    const plan = shardPlanFromConfig(c, md.model, 1 << 20);
    assert.deepEqual(plan.shards, ['s1', 's2', 's1~2', 's2~2']);
    assert.deepEqual(plan.placement.servers, ['s1', 's2']);
    for (const bad of ['0', '65', '1.5', 'two']) {
      const text = BASE.replace('  server_nodes: [s1, s2]\n', `  server_nodes: [s1, s2]\n  shards_per_server: ${bad}\n`);
      expectIssue(text, { path: 'cluster.shards_per_server', words: [], line: lineOf(text, 'shards_per_server') });
    }
  });

  test('cluster.start_barrier_seconds: 30 by default; 0 (no barrier) up to 3600 seconds, an error naming it otherwise', () => {
    assert.equal(parse(BASE).cluster.start_barrier_seconds, 30);
    for (const ok of ['0', '2.5', '3600']) {
      const text = BASE.replace('  server_nodes: [s1, s2]\n', `  server_nodes: [s1, s2]\n  start_barrier_seconds: ${ok}\n`);
      assert.equal(parse(text).cluster.start_barrier_seconds, Number(ok));
    }
    for (const bad of ['-1', '3601', 'soon']) {
      const text = BASE.replace('  server_nodes: [s1, s2]\n', `  server_nodes: [s1, s2]\n  start_barrier_seconds: ${bad}\n`);
      expectIssue(text, { path: 'cluster.start_barrier_seconds', words: [], line: lineOf(text, 'start_barrier_seconds') });
    }
  });

  test('examples/cluster.yaml and examples/quickstart.yaml parse', async () => {
    const cluster = await loadConfig('examples/cluster.yaml');
    assert.deepEqual(cluster.cluster.worker_groups.map((g) => [g.name, g.nodes.length, g.sync_mode, g.sync_steps]), [
      ['a100_group', 4, 'sync', 4], ['v100_group', 4, 'sync', 6], ['cpu_group', 2, 'async', null],
    ]);
    assert.equal(cluster.cluster.server_nodes.length, 3);
    assert.equal(cluster.model.type, 'mlp');

    const quick = await loadConfig('examples/quickstart.yaml');
    assert.equal(quick.model.type, 'ctr');
    assert.equal(quick.data.source, 'spam');
    assert.equal(quick.nats.servers, null, 'quickstart runs locally');
    assert.equal(serverNodes(quick).length, 2);
    assert.equal(allWorkerNodes(quick).length, 5);
    assert.equal(quick.cluster.worker_groups.length, 2);
    assert.deepEqual(inactiveSettings(quick), [], 'the quickstart asks for nothing that is not active');
  });

  test('defaults are filled; fields that do not apply are null', () => {
    const c = parse(BASE);
    assert.deepEqual(c.job, { name: 'hetps', run_dir: '.hetps/runs' });
    assert.deepEqual(c.nats, {
      servers: null, user: null, pass: null, token: null, nkey_seed: null, creds_file: null, tls: null,
      max_payload: null, connect_timeout_ms: 20_000, ping_interval_ms: 2_000, secure: false, auth_dir: null,
    });
    assert.deepEqual(c.cluster.worker_groups[0], { name: 'g1', nodes: ['w1', 'w2'], sync_mode: 'sync', sync_steps: 4, accumulation_steps: null, adaptive_threshold: null });
    assert.deepEqual(c.nodes, {});
    assert.equal(c.model.mlp, null);
    assert.deepEqual(c.model.ctr, { embedding_dim: 16, hidden: [256, 128], pooling: 'sum', wide: true, hash_buckets: 131_072 });
    assert.deepEqual(c.data, {
      source: 'spam', batch_size: 64, epochs: 1, test_fraction: 0.2, seed: 42, samples: null, test_samples: null, test_offset: null,
      vocab_size: 20_000, zipf_exponent: null, slots: null, dense_features: null, max_tokens: 256,
    });
    assert.equal(c.optimizer.type, 'adam');
    assert.equal(c.optimizer.learning_rate, 0.001);
    assert.equal(c.optimizer.beta1, 0.9);
    assert.equal(c.optimizer.momentum, null);
    assert.deepEqual(c.optimizer.schedule, { type: 'constant' });
    assert.equal(c.optimizer.sparse.type, 'adam');
    assert.deepEqual(c.training, { mode: 'hps', random_seed: 42, sync_initial_params: true, max_staleness: 32, staleness_tolerance: 'auto', group_lr_scaling: 'none', group_lr_warmup_windows: 20, local_updates: true, stream_slices: true, group_update: 'reduce', tail_dispatch: true, eval_every: 100, emulation_reference_step_ms: 100 });
    assert.deepEqual(c.communication, { backend: 'auto', compression: 'adaptive', compression_threshold: 0.5, compress_pulls: false, max_message_bytes: 1024 ** 3 });
    assert.equal(c.fault_tolerance.backup_factor, 1);
    assert.deepEqual(c.server, { use_gpu: false, gpu_id: 0 });
    assert.deepEqual(c.logging, { level: 'info' });
    assert.equal(c.source.file, FILE);
  });

  test('synthetic sources get their own defaults; data.seed follows training.random_seed', () => {
    const c = parse(BASE.replace('source: spam', 'source: ctr-synthetic') + 'training: { random_seed: 7 }\n');
    assert.equal(c.data.samples, 50_000);
    assert.equal(c.data.slots, 8);
    assert.equal(c.data.zipf_exponent, 1.1);
    assert.equal(c.data.test_fraction, null);
    assert.equal(c.data.seed, 7);
    const m = parse(BASE.replace('source: spam', 'source: mlp-synthetic').replace('type: ctr', 'type: mlp'));
    assert.deepEqual(m.model.mlp, { input_dim: 1024, hidden: [512, 256], classes: 10 });
    assert.equal(m.model.ctr, null);
  });

  test('an empty value means "not set": `nats:` with nothing under it is the local default', () => {
    const c = parse(BASE + 'nats:\njob:\n  name:\n');
    assert.equal(c.nats.servers, null);
    assert.equal(c.job.name, 'hetps');
  });

  test('node names may hold ":" (host:port)', () => {
    const c = parse(BASE.replace('[w1, w2]', '["a100-node-1:8080", w2]'));
    assert.equal(c.cluster.worker_groups[0]!.nodes[0], 'a100-node-1:8080');
  });

  test('optimizer.sparse overrides the dense optimizer; a new type starts from its own defaults', () => {
    const c = parse(BASE + `optimizer:
  type: adam
  learning_rate: 0.003
  weight_decay: 0.0001
  sparse: { type: adagrad }
`);
    assert.equal(c.optimizer.learning_rate, 0.003);
    assert.deepEqual(
      [c.optimizer.sparse.type, c.optimizer.sparse.learning_rate, c.optimizer.sparse.weight_decay, c.optimizer.sparse.epsilon, c.optimizer.sparse.beta1],
      ['adagrad', 0.01, 0.0001, 1e-10, null],
    );
    const same = parse(BASE + 'optimizer: { type: momentum, learning_rate: 0.2, momentum: 0.5, sparse: { learning_rate: 0.1 } }\n');
    assert.deepEqual([same.optimizer.sparse.type, same.optimizer.sparse.learning_rate, same.optimizer.sparse.momentum], ['momentum', 0.1, 0.5]);
  });

  test('learning-rate schedules are filled', () => {
    const c = parse(BASE + 'optimizer: { schedule: { type: warmup_cosine, warmup_steps: 10, total_steps: 100 } }\n');
    assert.deepEqual(c.optimizer.schedule, { type: 'warmup_cosine', warmup_steps: 10, total_steps: 100, min_multiplier: 0 });
    assert.deepEqual(c.optimizer.sparse.schedule, c.optimizer.schedule);
  });
});

// ---------------------------------------------------------------- YAML and file errors

describe('file and syntax errors', () => {
  test('a missing file is a ConfigError saying so', async () => {
    await assert.rejects(loadConfig('does/not/exist.yaml'), (e: unknown) =>
      e instanceof ConfigError && /does\/not\/exist\.yaml does not exist/.test(e.message));
  });

  test('loadConfig names the file in every message', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'hetps-config-'));
    try {
      const path = join(dir, 'bad.yaml');
      writeFileSync(path, BASE.replace('[s1, s2]', '[]'));
      await assert.rejects(loadConfig(path), (e: unknown) =>
        e instanceof ConfigError && e.message.includes(`${path}:5:17: cluster.server_nodes: must list at least one server node`));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test('a YAML syntax error reports the parser\'s line and column', () => {
    const text = 'cluster:\n  worker_groups: [a, b\n  server_nodes: [s]\n';
    expectIssue(text, { path: '', words: ['YAML syntax', 'Flow sequence'], line: 3, column: 3 });
  });

  test('a key given twice is a syntax error at the second one', () => {
    const text = BASE + 'model: { type: mlp }\n';
    expectIssue(text, { path: '', words: ['YAML syntax', 'unique'], line: lineOf(text, 'model:', 2), column: 1 });
  });

  test('an empty file and a file that is not a mapping are rejected', () => {
    expectIssue('# nothing here\n', { path: '', words: ['empty', 'cluster', 'model', 'data'], line: null });
    expectIssue('- a\n- b\n', { path: '', words: ['must be a mapping', 'a list'], line: 1 });
  });
});

// ---------------------------------------------------------------- schema rules

describe('schema rules', () => {
  test('an unknown key is an error with a suggestion', () => {
    const text = BASE.replace('worker_groups:', 'worker_group:');
    const issue = expectIssue(text, { path: 'cluster.worker_group', words: ['unknown key `cluster.worker_group`', '(did you mean `worker_groups`?)'], line: 2, column: 3 });
    assert.equal(issue.message, 'unknown key `cluster.worker_group` (did you mean `worker_groups`?)');
  });

  test('unknown keys inside list items and flow mappings point at the key', () => {
    const text = BASE.replace('      nodes: [w1, w2]', '      nodes: [w1, w2]\n      syncSteps: 2') + 'communication: { backend: auto, compresion: fp16 }\n';
    expectIssue(text, { path: 'cluster.worker_groups[0].syncSteps', words: ['unknown key', 'did you mean `sync_steps`'], line: 5, column: 7 });
    expectIssue(text, { path: 'communication.compresion', words: ['unknown key', 'did you mean `compression`'], line: lineOf(text, 'compresion'), column: 33 });
  });

  test('an unknown key with no close match lists the known keys', () => {
    const text = BASE + 'training: { zzz: 1 }\n';
    expectIssue(text, { path: 'training.zzz', words: ['unknown key', 'known keys: mode, random_seed'], line: lineOf(text, 'zzz') });
  });

  test('wrong types and ranges name the value', () => {
    const text = BASE + 'training: { max_staleness: -1, eval_every: 2.5 }\n';
    expectIssue(text, { path: 'training.max_staleness', words: ['must be an integer ≥ 0', 'got -1'], line: lineOf(text, 'max_staleness') });
    expectIssue(text, { path: 'training.eval_every', words: ['must be a positive integer', 'got 2.5'], line: lineOf(text, 'eval_every') });
    const quoted = BASE.replace('data: { source: spam }', 'data: { source: spam, batch_size: "32" }');
    expectIssue(quoted, { path: 'data.batch_size', words: ['must be a positive integer', '"32" (a string)'], line: 7 });
  });

  test('an invalid choice lists the choices and suggests the closest', () => {
    const text = BASE + 'training: { mode: hsp }\n';
    expectIssue(text, { path: 'training.mode', words: ['must be one of bsp, asp, hps', 'got "hsp"', 'did you mean `hps`'], line: 8 });
    const lb = BASE + 'load_balancing: { capacity: measure }\n';
    expectIssue(lb, { path: 'load_balancing.capacity', words: ['must be one of declared, measured', 'got "measure"', 'did you mean `measured`'], line: 8 });
    assert.equal(parse(BASE + 'load_balancing: { capacity: measured }\n').load_balancing.capacity, 'measured');
    assert.equal(parse(BASE).load_balancing.capacity, 'declared', 'declared by default');
    expectIssue(BASE + 'monitoring: { auth: tokens }\n', { path: 'monitoring.auth', words: ['must be one of none, token', 'got "tokens"', 'did you mean `token`'], line: 8 });
    assert.deepEqual([parse(BASE).monitoring.auth, parse(BASE).monitoring.token_file], ['none', null]);
  });

  test('required keys: model.type and data.source', () => {
    const text = BASE.replace('model: { type: ctr }', 'model:\n  ctr: { embedding_dim: 8 }').replace('data: { source: spam }', 'data:\n  source:');
    expectIssue(text, { path: 'model.type', words: ['is required'], line: lineOf(text, 'model:') });
    expectIssue(text, { path: 'data.source', words: ['is required'], line: lineOf(text, 'source:') });
  });

  test('model sizes must be positive integers', () => {
    const text = BASE.replace('model: { type: ctr }', 'model:\n  type: ctr\n  ctr:\n    embedding_dim: 0\n    hidden: [32, -4]');
    expectIssue(text, { path: 'model.ctr.embedding_dim', words: ['must be a positive integer', 'got 0'], line: lineOf(text, 'embedding_dim') });
    expectIssue(text, { path: 'model.ctr.hidden[1]', words: ['must be a positive integer', 'got -4'], line: lineOf(text, 'hidden'), column: 18 });
  });

  test('data.test_fraction is strictly between 0 and 1', () => {
    for (const v of ['0', '1', '1.5']) {
      const text = BASE.replace('source: spam', `source: spam, test_fraction: ${v}`);
      expectIssue(text, { path: 'data.test_fraction', words: ['between 0 and 1', `got ${v}`], line: 7 });
    }
  });

  test('emulate.speed is in (0, 1] and bandwidth positive', () => {
    const text = BASE + 'nodes:\n  w1: { emulate: { speed: 0, bandwidth_mbps: -5 } }\n';
    expectIssue(text, { path: 'nodes.w1.emulate.speed', words: ['(0, 1]', 'got 0'], line: lineOf(text, 'speed') });
    expectIssue(text, { path: 'nodes.w1.emulate.bandwidth_mbps', words: ['> 0', 'got -5'], line: lineOf(text, 'speed') });
  });

  test('emulate.link: hold or tc; tc needs the bandwidth it limits the link to', () => {
    const text = BASE + 'nodes:\n  w1: { emulate: { speed: 0.5, link: tc } }\n  w2: { emulate: { bandwidth_mbps: 3, link: wire } }\n';
    expectIssue(text, { path: 'nodes.w1.emulate.link', words: ['link: tc limits', 'bandwidth_mbps, which is not set'], line: lineOf(text, 'w1:') });
    expectIssue(text, { path: 'nodes.w2.emulate.link', words: ['hold', 'tc', 'wire'], line: lineOf(text, 'w2:') });
    const c = parse(BASE + 'nodes:\n  w1: { emulate: { bandwidth_mbps: 3, link: tc } }\n  w2: { emulate: { bandwidth_mbps: 5 } }\n  s1: { emulate: { speed: 0.5 } }\n');
    assert.deepEqual(tcLinkedNodes(c), [{ node: 'w1', mbps: 3 }]);
    // The worker holds its transfers only for link: hold; a tc link is the kernel's to limit.
    assert.equal(heldBandwidthMbps(nodeOverrides(c, 'w1').emulate), null);
    assert.equal(heldBandwidthMbps(nodeOverrides(c, 'w2').emulate), 5);
    assert.equal(heldBandwidthMbps(nodeOverrides(c, 's1').emulate), null);
    assert.equal(heldBandwidthMbps(nodeOverrides(c, 's2').emulate), null);
  });

  test('nats.servers must be NATS URLs', () => {
    const text = BASE + 'nats:\n  servers: ["nats://a:4222", "http://b:80", "localhost:4222"]\n';
    expectIssue(text, { path: 'nats.servers[1]', words: ['http://b:80', 'scheme http'], line: lineOf(text, 'servers'), column: 30 });
  });
});

// ---------------------------------------------------------------- names and cluster rules

describe('cluster rules', () => {
  test('names with "." or spaces are rejected as subject tokens', () => {
    const text = BASE.replace('name: g1', 'name: g.1').replace('[w1, w2]', '[w1, "w 2"]') + 'job: { name: "my job" }\n';
    expectIssue(text, { path: 'cluster.worker_groups[0].name', words: ['group name "g.1" contains "."', 'NATS subject'], line: 3 });
    expectIssue(text, { path: 'cluster.worker_groups[0].nodes[1]', words: ['node name "w 2" contains " "'], line: 4 });
    expectIssue(text, { path: 'job.name', words: ['job name "my job"'], line: lineOf(text, 'job:') });
    const dotted = BASE.replace('[s1, s2]', '["server.1:9090"]');
    expectIssue(dotted, { path: 'cluster.server_nodes[0]', words: ['node name "server.1:9090" contains "."'], line: 5 });
  });

  test('a node listed twice in one group names both places', () => {
    const text = BASE.replace('[w1, w2]', '[w1, w1]');
    expectIssue(text, { path: 'cluster.worker_groups[0].nodes[1]', words: ['duplicate node name "w1"', 'cluster.worker_groups[0].nodes[0] (line 4)'], line: 4, column: 19 });
  });

  test('a node in two groups, or a worker that is also a server, is a duplicate', () => {
    const text = `cluster:
  worker_groups:
    - name: g1
      nodes: [w1, w2]
    - name: g2
      nodes:
        - w3
        - w2
  server_nodes: [s1, w3]
${MODEL_AND_DATA}`;
    expectIssue(text, { path: 'cluster.worker_groups[1].nodes[1]', words: ['duplicate node name "w2"', 'cluster.worker_groups[0].nodes[1] (line 4)'], line: 8 });
    expectIssue(text, { path: 'cluster.server_nodes[1]', words: ['duplicate node name "w3"', 'cluster.worker_groups[1].nodes[0] (line 7)'], line: 9 });
  });

  test('duplicate group names name both places', () => {
    const text = BASE.replace('  server_nodes', '    - name: g1\n      nodes: [w9]\n  server_nodes');
    expectIssue(text, { path: 'cluster.worker_groups[1].name', words: ['duplicate group name "g1"', 'cluster.worker_groups[0].name (line 3)'], line: 5 });
  });

  test('empty or missing server_nodes is an error', () => {
    expectIssue(BASE.replace('[s1, s2]', '[]'), { path: 'cluster.server_nodes', words: ['at least one server node'], line: 5, column: 17 });
    const missing = BASE.replace('  server_nodes: [s1, s2]\n', '');
    expectIssue(missing, { path: 'cluster.server_nodes', words: ['is required'], line: 1 });
  });

  test('a group with no nodes is an error', () => {
    expectIssue(BASE.replace('[w1, w2]', '[]'), { path: 'cluster.worker_groups[0].nodes', words: ['at least one node'], line: 4 });
    const noNodes = BASE.replace('      nodes: [w1, w2]\n', '');
    expectIssue(noNodes, { path: 'cluster.worker_groups[0].nodes', words: ['is required'], line: 3 });
  });

  test('sync_steps is a positive integer and only for sync groups', () => {
    const zero = BASE.replace('      nodes: [w1, w2]', '      nodes: [w1, w2]\n      sync_steps: 0');
    expectIssue(zero, { path: 'cluster.worker_groups[0].sync_steps', words: ['must be a positive integer', 'got 0'], line: 5, column: 19 });
    const asyncGroup = BASE.replace('      nodes: [w1, w2]', '      nodes: [w1, w2]\n      sync_mode: async\n      sync_steps: 4');
    expectIssue(asyncGroup, { path: 'cluster.worker_groups[0].sync_steps', words: ['only applies to sync_mode: sync', 'async'], line: 6, column: 7 });
    const accumulation = BASE.replace('      nodes: [w1, w2]', '      nodes: [w1, w2]\n      accumulation_steps: 2');
    expectIssue(accumulation, { path: 'cluster.worker_groups[0].accumulation_steps', words: ['only applies to sync_mode: accumulation', 'sync'], line: 5 });
  });

  test('an override for a node the cluster does not have is an error naming it', () => {
    const text = BASE + 'nodes:\n  w1: { provider: cuda }\n  w3: { threads: 4 }\n';
    expectIssue(text, { path: 'nodes.w3', words: ['unknown node "w3"', 'not in cluster.worker_groups, cluster.worker_nodes, cluster.server_nodes or fault_tolerance.standby_workers'], line: 10, column: 3 });
  });

  test('backups need more servers than the backup factor', () => {
    const text = BASE.replace('[s1, s2]', '[s1]') + 'fault_tolerance: { backup_factor: 1 }\n';
    expectIssue(text, { path: 'fault_tolerance.backup_factor', words: ['at least 2 server nodes', 'has 1'], line: 8 });
  });
});

// ---------------------------------------------------------------- cross-field rules

describe('cross-field rules', () => {
  test('only one NATS authentication method', () => {
    const text = BASE + 'nats:\n  servers: [nats://a:4222]\n  user: u\n  pass: p\n  token: t\n';
    expectIssue(text, { path: 'nats.token', words: ['several authentication methods', 'user/pass, token', 'use only one'], line: 12 });
    const creds = BASE + 'nats:\n  nkey_seed: SUAB\n  creds_file: x.creds\n';
    expectIssue(creds, { path: 'nats.creds_file', words: ['nkey_seed, creds_file'], line: 10 });
  });

  test('user needs pass; a client certificate needs its key', () => {
    const text = BASE + 'nats:\n  user: u\n  tls: { cert_file: c.pem }\n';
    expectIssue(text, { path: 'nats.user', words: ['needs nats.pass'], line: 9 });
    expectIssue(text, { path: 'nats.tls.cert_file', words: ['needs nats.tls.key_file'], line: 10 });
  });

  test('max_payload applies to the local cluster only', () => {
    const text = BASE + 'nats: { servers: [nats://a:4222], max_payload: 8388608 }\n';
    expectIssue(text, { path: 'nats.max_payload', words: ['only applies to the local cluster'], line: 8 });
  });

  test('the model section of the other type is an error', () => {
    const text = BASE.replace('model: { type: ctr }', 'model:\n  type: ctr\n  mlp: { classes: 2 }');
    expectIssue(text, { path: 'model.mlp', words: ['only applies to model.type: mlp', 'model.type is ctr'], line: 8, column: 3 });
  });

  test('data fields of another source are errors', () => {
    const text = BASE.replace('data: { source: spam }', 'data:\n  source: spam\n  zipf_exponent: 1.2\n  slots: 4');
    expectIssue(text, { path: 'data.zipf_exponent', words: ['only applies to data.source: ctr-synthetic', 'spam'], line: 9 });
    expectIssue(text, { path: 'data.slots', words: ['only applies to data.source: ctr-synthetic'], line: 10 });
    expectIssue(BASE.replace('data: { source: spam }', 'data:\n  source: spam\n  test_offset: 100'), { path: 'data.test_offset', words: ['only applies to data.source: ctr-synthetic or mlp-synthetic', 'spam'], line: 9 });
  });

  test('data source and model type must fit', () => {
    const text = BASE.replace('source: spam', 'source: mlp-synthetic');
    expectIssue(text, { path: 'data.source', words: ['mlp-synthetic needs model.type mlp', 'model.type is ctr'], line: 7 });
    const spamMlp = BASE.replace('model: { type: ctr }', 'model: { type: mlp, mlp: { classes: 10 } }');
    expectIssue(spamMlp, { path: 'model.mlp.classes', words: ['must be 2', 'spam'], line: 6 });
  });

  test('per-slot hash_buckets must have one entry per slot', () => {
    const text = BASE.replace('model: { type: ctr }', 'model: { type: ctr, ctr: { hash_buckets: [100, 200] } }').replace('source: spam', 'source: ctr-synthetic, slots: 3');
    expectIssue(text, { path: 'model.ctr.hash_buckets', words: ['2 entries', '3 slots'], line: 6 });
    const ok = parse(text.replace('[100, 200]', '[100, 200, 300]'));
    assert.deepEqual(ok.model.ctr?.hash_buckets, [100, 200, 300]);
  });

  test('optimizer fields of another optimizer type are errors, in optimizer.sparse too', () => {
    const text = BASE + 'optimizer:\n  type: sgd\n  beta1: 0.9\n  sparse: { type: adam, momentum: 0.9 }\n';
    expectIssue(text, { path: 'optimizer.beta1', words: ['only applies to type adam', 'this optimizer is sgd'], line: 10 });
    expectIssue(text, { path: 'optimizer.sparse.momentum', words: ['only applies to type momentum', 'this optimizer is adam'], line: 11 });
  });

  test('learning_rate must be positive', () => {
    const text = BASE + 'optimizer: { learning_rate: 0 }\n';
    expectIssue(text, { path: 'optimizer.learning_rate', words: ['must be a number > 0', 'got 0'], line: 8 });
  });

  test('schedules: required fields, foreign fields, warmup before total', () => {
    const text = BASE + 'optimizer:\n  schedule: { type: step, decay_steps: 3 }\n';
    expectIssue(text, { path: 'optimizer.schedule.step_size', words: ['is required for schedule type step'], line: 9 });
    expectIssue(text, { path: 'optimizer.schedule.decay_steps', words: ['does not apply to schedule type step'], line: 9 });
    const cosine = BASE + 'optimizer:\n  schedule: { type: warmup_cosine, warmup_steps: 100, total_steps: 50 }\n';
    expectIssue(cosine, { path: 'optimizer.schedule.total_steps', words: ['greater than warmup_steps (100)', 'got 50'], line: 9 });
  });

  test('max_staleness does not apply to bsp', () => {
    const text = BASE + 'training:\n  mode: bsp\n  max_staleness: 2\n';
    expectIssue(text, { path: 'training.max_staleness', words: ['only applies to training.mode asp or hps'], line: 10 });
  });

  test('staleness_tolerance: auto or an integer ≥ 0, hps only', () => {
    assert.equal(parseConfig(BASE + 'training: { staleness_tolerance: 3 }\n', FILE).training.staleness_tolerance, 3);
    assert.equal(parseConfig(BASE + 'training: { staleness_tolerance: auto }\n', FILE).training.staleness_tolerance, 'auto');
    const bad = BASE + 'training: { staleness_tolerance: often }\n';
    expectIssue(bad, { path: 'training.staleness_tolerance', words: ['must be auto or an integer ≥ 0'], line: lineOf(bad, 'staleness_tolerance') });
    const negative = BASE + 'training: { staleness_tolerance: -2 }\n';
    expectIssue(negative, { path: 'training.staleness_tolerance', words: ['must be auto or an integer ≥ 0'], line: lineOf(negative, 'staleness_tolerance') });
    const bsp = BASE + 'training:\n  mode: bsp\n  staleness_tolerance: 2\n';
    expectIssue(bsp, { path: 'training.staleness_tolerance', words: ['only applies to training.mode hps'], line: 10 });
  });

  test('staleness_tolerance { dense, sparse }: one for the dense blocks and one for the embedding rows; the shards get both', () => {
    const c = parseConfig(BASE + 'training: { staleness_tolerance: { dense: 0, sparse: auto } }\n', FILE);
    assert.deepEqual(c.training.staleness_tolerance, { dense: 0, sparse: 'auto' });
    assert.deepEqual(stalenessPolicyFromConfig(c), { maxStaleness: 32, scaling: 'inverse', tolerance: 0, sparseTolerance: 'auto' });
    assert.deepEqual(stalenessPolicyFromConfig(parseConfig(BASE + 'training: { staleness_tolerance: { sparse: 4 } }\n', FILE)),
      { maxStaleness: 32, scaling: 'inverse', tolerance: 'auto', sparseTolerance: 4 }, 'an absent one is auto');
    assert.deepEqual(stalenessPolicyFromConfig(parseConfig(BASE, FILE)), { maxStaleness: 32, scaling: 'inverse', tolerance: 'auto' }, 'the default: auto for both');
    assert.deepEqual(stalenessPolicyFromConfig(parseConfig(BASE + 'training: { staleness_tolerance: 2 }\n', FILE)),
      { maxStaleness: 32, scaling: 'inverse', tolerance: 2 }, 'one number: the same for both');
    for (const bad of ['{ dense: -1 }', '{ rows: 0 }', '{}', '{ dense: often, sparse: 0 }', '[0, 1]']) {
      const text = BASE + `training: { staleness_tolerance: ${bad} }\n`;
      expectIssue(text, { path: 'training.staleness_tolerance', words: ['must be auto or an integer ≥ 0, or a map { dense, sparse } of those'], line: lineOf(text, 'staleness_tolerance') });
    }
  });

  test('max_staleness { dense, sparse }: a bound for the dense blocks and one for the embedding rows; an absent one is the default', () => {
    const c = parseConfig(BASE + 'training: { max_staleness: { dense: 4, sparse: 16 } }\n', FILE);
    assert.deepEqual(c.training.max_staleness, { dense: 4, sparse: 16 });
    assert.deepEqual(stalenessPolicyFromConfig(c), { maxStaleness: 4, sparseMaxStaleness: 16, scaling: 'inverse', tolerance: 'auto' });
    assert.deepEqual(stalenessPolicyFromConfig(parseConfig(BASE + 'training: { max_staleness: { dense: 4 } }\n', FILE)),
      { maxStaleness: 4, sparseMaxStaleness: 32, scaling: 'inverse', tolerance: 'auto' });
    assert.deepEqual(stalenessPolicyFromConfig(parseConfig(BASE + 'training: { max_staleness: { sparse: 0 }, staleness_tolerance: { dense: 0 } }\n', FILE)),
      { maxStaleness: 32, sparseMaxStaleness: 0, scaling: 'inverse', tolerance: 0, sparseTolerance: 'auto' });
    assert.deepEqual(stalenessPolicyFromConfig(parseConfig(BASE + 'training: { max_staleness: 8 }\n', FILE)), { maxStaleness: 8, scaling: 'inverse', tolerance: 'auto' }, 'one number: one bound');
    for (const bad of ['{ dense: -1 }', '{ rows: 4 }', '{}', '{ dense: 2.5, sparse: 8 }', '[4, 32]', 'auto']) {
      const text = BASE + `training: { max_staleness: ${bad} }\n`;
      expectIssue(text, { path: 'training.max_staleness', words: ['must be an integer ≥ 0, or a map { dense, sparse } of those'], line: lineOf(text, 'max_staleness') });
    }
    const bsp = BASE + 'training:\n  mode: bsp\n  max_staleness: { dense: 4 }\n';
    expectIssue(bsp, { path: 'training.max_staleness', words: ['only applies to training.mode asp or hps'], line: 10 });
  });
});

// ---------------------------------------------------------------- all together

test('every problem is reported in one ConfigError, in file order, each on its own line', () => {
  const text = `cluster:
  worker_group: []
  worker_groups:
    - name: g1
      nodes: [w1, w1]
      sync_mode: async
      sync_steps: 3
  server_nodes: []
model: { type: ctr, mlp: {} }
data: { source: spam, test_fraction: 2 }
nodes:
  nobody: {}
`;
  const { error, issues } = issuesOf(text);
  assert.deepEqual(issues.map((i) => [i.path, i.line]), [
    ['cluster.worker_group', 2],
    ['cluster.worker_groups[0].nodes[1]', 5],
    ['cluster.worker_groups[0].sync_steps', 7],
    ['cluster.server_nodes', 8],
    ['model.mlp', 9],
    ['data.test_fraction', 10],
    ['nodes.nobody', 12],
  ]);
  const lines = error.message.split('\n');
  assert.equal(lines[0], `invalid config ${FILE} (7 problems):`);
  assert.equal(lines.length, 8);
  for (const [i, issue] of issues.entries()) assert.ok(lines[i + 1]!.includes(`${FILE}:${issue.line}:${issue.column}: ${issue.path}: `));
  assert.equal(error.name, 'ConfigError');
  assert.equal((error.data as { file: string }).file, FILE);
});

// ---------------------------------------------------------------- inactive settings

describe('inactiveSettings', () => {
  test('the article\'s example lists nothing: adaptive compression and compression_threshold are acted on', () => {
    const c = parse(ARTICLE + MODEL_AND_DATA);
    assert.deepEqual(inactiveSettings(c), []);
  });

  test('lists only what the file sets, and only values that ask for something', () => {
    assert.deepEqual(inactiveSettings(parse(BASE)), [], 'defaults are not reported');
    assert.deepEqual(inactiveSettings(parse(BASE + 'communication: { compression: none }\nserver: { use_gpu: false }\n')), []);
    assert.deepEqual(inactiveSettings(parse(BASE + 'server: { use_gpu: true }\nload_balancing: { sustain_seconds: 30 }\n')), [
      'server.use_gpu=true (not active yet: server-side optimizers run on the CPU)',
    ], 'two server nodes under sync replication: the balancer acts on sustain_seconds');
    assert.deepEqual(inactiveSettings(parse(BASE + 'load_balancing: { sustain_seconds: 30 }\nfault_tolerance: { replication: async }\n')).map((l) => l.slice(0, l.indexOf(' ('))), [
      'load_balancing.sustain_seconds=30',
    ], 'async replication: no handover, so the setting is listed');
  });

  test('training.local_updates is reported outside hps, where no window takes several steps', () => {
    assert.deepEqual(inactiveSettings(parse(BASE + 'training: { mode: asp, local_updates: true }\n')), [
      'training.local_updates=true (not active yet: only hps windows take several steps between pulls; asp and bsp pull before every step)',
    ]);
    assert.deepEqual(inactiveSettings(parse(BASE + 'training: { mode: bsp, local_updates: true }\n')).length, 1);
    assert.deepEqual(inactiveSettings(parse(BASE + 'training: { mode: asp, local_updates: false }\n')), [], 'turning it off asks for nothing');
    assert.deepEqual(inactiveSettings(parse(BASE + 'training: { mode: hps, local_updates: true }\n')), []);
  });

  test('training.stream_slices is reported outside hps, where no group exchanges slices', () => {
    assert.deepEqual(inactiveSettings(parse(BASE + 'training: { mode: asp, stream_slices: true }\n')), [
      'training.stream_slices=true (not active yet: only hps groups exchange gradient slices; asp and bsp workers push their own gradients)',
    ]);
    assert.deepEqual(inactiveSettings(parse(BASE + 'training: { mode: hps, stream_slices: true }\n')), []);
    assert.throws(() => parse(BASE + 'training: { mode: hps, stream_slices: sometimes }\n'), /training\.stream_slices/);
  });
});

// ---------------------------------------------------------------- helpers

describe('helpers', () => {
  const c = parse(ARTICLE.replace('server: { use_gpu: false }', 'server: { use_gpu: false }\nnodes:\n  "cpu-node-1:8080": { provider: cpu, threads: 8, emulate: { speed: 0.25 } }') + MODEL_AND_DATA);

  test('allWorkerNodes gives each worker its group and rank', () => {
    assert.deepEqual(allWorkerNodes(c), [
      { name: 'a100-node-1:8080', group: 'a100_group', rank: 0, groupSize: 2, syncMode: 'sync' },
      { name: 'a100-node-2:8080', group: 'a100_group', rank: 1, groupSize: 2, syncMode: 'sync' },
      { name: 'cpu-node-1:8080', group: 'cpu_group', rank: 0, groupSize: 1, syncMode: 'async' },
    ]);
  });

  test('serverNodes in file order', () => {
    assert.deepEqual(serverNodes(c), [{ name: 'server-1:9090', rank: 0 }, { name: 'server-2:9090', rank: 1 }]);
  });

  test('nodeOverrides: the node\'s entry, all-null for nodes without one, an error for strangers', () => {
    assert.deepEqual(nodeOverrides(c, 'cpu-node-1:8080'), { emulate: { speed: 0.25, bandwidth_mbps: null, link: 'hold' }, capacity: null, provider: 'cpu', threads: 8 });
    assert.deepEqual(nodeOverrides(c, 'server-1:9090'), { emulate: null, capacity: null, provider: null, threads: null });
    assert.throws(() => nodeOverrides(c, 'nobody'), (e: unknown) => e instanceof ConfigError && /node "nobody" is not in/.test(e.message));
  });

  test('natsConnection maps the nats section to the runtime\'s options', () => {
    const n = natsConnection(parse(BASE + 'nats:\n  servers: [nats://a:4222]\n  token: s3cret\n  tls: { ca_file: ca.pem }\n'));
    assert.deepEqual(n, {
      servers: ['nats://a:4222'],
      auth: { user: null, pass: null, token: 's3cret', nkeySeed: null, credsFile: null },
      tls: { caFile: 'ca.pem', certFile: null, keyFile: null, handshakeFirst: false },
      connectTimeoutMs: 20_000,
      pingIntervalMs: 2_000,
      maxMessageBytes: 1024 ** 3,
    });
    assert.deepEqual(natsConnection(parse(BASE)).auth, null);
  });

  test('communication.max_message_bytes: every process connects with it; whole bytes from 1 MiB to 4 GiB, refused by name otherwise', () => {
    assert.equal(natsConnection(parse(`${BASE}communication: { max_message_bytes: 2147483648 }\n`)).maxMessageBytes, 2 ** 31);
    assert.equal(natsConnection(parse(`${BASE}communication: { max_message_bytes: 4294967296 }\n`)).maxMessageBytes, 2 ** 32);
    for (const bad of ['0', '65536', '4294967297', '1500000.5', '"1GiB"']) {
      const text = `${BASE}communication: { max_message_bytes: ${bad} }\n`;
      expectIssue(text, { path: 'communication.max_message_bytes', words: ['must be a whole number of bytes from 1 MiB (1048576) to 4 GiB (4294967296)'], line: lineOf(text, 'max_message_bytes') });
    }
  });
});

describe('standby workers', () => {
  test('hps: named standbys are nodes of the file (overrides allowed) outside every group', () => {
    const c = parse(BASE + 'fault_tolerance: { standby_workers: [w9], preheat_backup: true }\nnodes: { w9: { emulate: { speed: 0.5 } } }\n');
    assert.deepEqual(standbyWorkerNodes(c).map((n) => [n.name, n.group]), [['w9', null]]);
    assert.equal(nodeOverrides(c, 'w9').emulate?.speed, 0.5);
    assert.ok(!allWorkerNodes(c).some((n) => n.name === 'w9'), 'a standby trains nothing until it takes a place');
  });

  test('a standby named like another node, in a mode without groups, or preheat_backup without standbys: clear errors', () => {
    const dup = issuesOf(BASE + 'fault_tolerance: { standby_workers: [w2] }\n').issues;
    assert.ok(dup.some((i) => i.path === 'fault_tolerance.standby_workers[0]' && /duplicate node name "w2"/.test(i.message)), JSON.stringify(dup));
    const asp = issuesOf(BASE + 'training: { mode: asp }\nfault_tolerance: { standby_workers: [w9] }\n').issues;
    assert.ok(asp.some((i) => i.path === 'fault_tolerance.standby_workers' && /training.mode asp has no groups/.test(i.message)), JSON.stringify(asp));
    const cold = issuesOf(BASE + 'fault_tolerance: { preheat_backup: true }\n').issues;
    assert.ok(cold.some((i) => i.path === 'fault_tolerance.preheat_backup' && /standby_workers lists none/.test(i.message)), JSON.stringify(cold));
  });
});
