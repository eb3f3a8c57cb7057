/** The `hetps` command as a user runs it: help, version, profile, demo. */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { readFileSync } from 'node:fs';

const run = promisify(execFile);
const bin = new URL('../../bin/hetps.mjs', import.meta.url).pathname;
const hetps = (args: string[], env: NodeJS.ProcessEnv = {}) =>
  run(process.execPath, [bin, ...args], { env: { ...process.env, ...env }, timeout: 120_000, maxBuffer: 16 * 1024 * 1024 });

test('--version prints the package version and --help lists the commands', async () => {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
  assert.equal((await hetps(['--version'])).stdout.trim(), pkg.version);
  const help = (await hetps(['--help'])).stdout;
  for (const cmd of ['nats', 'demo', 'profile', 'train-local']) assert.match(help, new RegExp(`\\b${cmd}\\b`), `help lists ${cmd}`);
});

test('profile --json measures this node', { timeout: 120_000 }, async () => {
  const { stdout } = await hetps(['profile', '--json', '--node', 'test-node', '--repeats', '2']);
  const p = JSON.parse(stdout) as Record<string, unknown>;
  assert.deepEqual(Object.keys(p).sort(), ['cpus', 'gather_rows_per_s', 'matmul_gflops', 'memory_gb', 'node', 'providers', 'variance']);
  assert.equal(p.node, 'test-node');
  assert.ok((p.matmul_gflops as number) > 0);
  assert.ok((p.gather_rows_per_s as number) > 0);
  assert.ok((p.memory_gb as number) > 0);
  assert.ok(Number.isInteger(p.cpus) && (p.cpus as number) >= 1);
  assert.ok((p.providers as string[]).includes('cpu'));
  assert.ok((p.variance as number) >= 0);
});

test('profile rejects an unknown provider with a message naming it', async () => {
  await assert.rejects(hetps(['profile', '--provider', 'tpu']), (e: { code: number; stderr: string }) => e.code === 2 && /--provider must be cpu or cuda/.test(e.stderr));
});

test('demo runs on the embedded bus without nats-server and says so', { timeout: 120_000 }, async () => {
  const { stdout, stderr } = await hetps(['demo', '--json', '--requests', '300'], { NATS_SERVER_BIN: '/nonexistent/nats-server' });
  const s = JSON.parse(stdout) as { transport: string; exactly_once: boolean; chunked_messages: number; label: string };
  assert.equal(s.transport, 'embedded');
  assert.equal(s.exactly_once, true);
  assert.ok(s.chunked_messages >= 1);
  assert.match(s.label, /demo/);
  assert.match(stderr, /embedded in-process bus/);
});

test('demo runs over a real local 3-node cluster when nats-server is installed', { timeout: 120_000 }, async () => {
  const { stdout } = await hetps(['demo', '--json', '--requests', '500']);
  const s = JSON.parse(stdout) as { transport: string; exactly_once: boolean; requests: number };
  assert.equal(s.transport, 'nats');
  assert.equal(s.requests, 500);
  assert.equal(s.exactly_once, true);
});
