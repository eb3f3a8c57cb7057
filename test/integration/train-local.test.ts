/**
 * `hetps train-local` end to end: the CLI as a user runs it, in a child process.
 * The examples are the single-process references distributed runs are
 * compared against, so their quality is pinned here.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { dataSourceFromConfig } from '../../cli/train-local.ts';
import { MissingDependencyError } from '../../runtime/errors.ts';
import { parseConfig } from '../../topology/mod.ts';

const root = fileURLToPath(new URL('../../', import.meta.url));
const bin = join(root, 'bin', 'hetps.mjs');

interface Run { code: number; stdout: string; stderr: string }

function hetps(args: string[], timeoutMs = 120_000): Promise<Run> {
  return new Promise((resolve) => {
    execFile(process.execPath, [bin, ...args], { cwd: root, timeout: timeoutMs, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err === null ? 0 : typeof (err as { code?: unknown }).code === 'number' ? (err as { code: number }).code : 1;
      resolve({ code, stdout, stderr });
    });
  });
}

/** The one JSON object `--json` prints: stdout must hold nothing else. */
function finalJson(run: Run): Record<string, unknown> {
  assert.equal(run.code, 0, `exit code ${run.code}; stderr:\n${run.stderr}`);
  const lines = run.stdout.trim().split('\n');
  assert.equal(lines.length, 1, `stdout should be one JSON line, got:\n${run.stdout}`);
  return JSON.parse(lines[0]!) as Record<string, unknown>;
}

function assertCommonFields(r: Record<string, unknown>): void {
  for (const key of ['test_logloss', 'samples', 'samples_per_s', 'wall_s']) {
    assert.equal(typeof r[key], 'number', `${key} is a number`);
    assert.ok(Number.isFinite(r[key] as number) && (r[key] as number) > 0, `${key} = ${String(r[key])}`);
  }
  assert.ok('test_auc' in r);
}

test('spam example: ctr on Spam Assassin reaches test AUC ≥ 0.98 and reports one JSON object', async () => {
  const run = await hetps(['train-local', '--config', 'examples/spam-local.yaml', '--json']);
  const r = finalJson(run);
  assertCommonFields(r);
  assert.equal(r.model, 'ctr');
  assert.equal(typeof r.test_auc, 'number');
  assert.ok((r.test_auc as number) >= 0.98, `test AUC ${String(r.test_auc)}`);
  assert.ok((r.test_logloss as number) < 0.2, `test logloss ${String(r.test_logloss)}`);
  assert.equal('test_accuracy' in r, false);
  assert.equal((r.history as unknown[]).length, 2, 'one entry per epoch (data.epochs)');
  // stderr is not a TTY here: plain progress lines and one summary line per epoch
  assert.match(run.stderr, /epoch 1\/2: \d+%/);
  assert.match(run.stderr, /epoch 2\/2: train logloss [\d.]+ +test logloss [\d.]+ +test AUC [\d.]+/);
});

test('mlp example: 1024-d 10-class synthetic data reaches test accuracy ≥ 0.95', async () => {
  const r = finalJson(await hetps(['train-local', '--config', 'examples/mlp-local.yaml', '--json']));
  assertCommonFields(r);
  assert.equal(r.model, 'mlp');
  assert.equal(r.test_auc, null);
  assert.equal(typeof r.test_accuracy, 'number');
  assert.ok((r.test_accuracy as number) >= 0.95, `test accuracy ${String(r.test_accuracy)}`);
});

test('malformed configs and flags exit non-zero naming the field', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'hetps-train-local-'));
  try {
    const spam = await readFile(join(root, 'examples', 'spam-local.yaml'), 'utf8');
    const cases: { name: string; text: string; field: RegExp }[] = [
      { name: 'unknown-model.yaml', text: spam.replace('type: ctr', 'type: transformer').replace(/\n  ctr:\n(    .*\n)+/, '\n'), field: /model\.type/ },
      { name: 'negative-batch.yaml', text: spam.replace('batch_size: 64', 'batch_size: -64'), field: /data\.batch_size/ },
      { name: 'negative-embedding.yaml', text: spam.replace('embedding_dim: 8', 'embedding_dim: -8'), field: /model\.ctr\.embedding_dim/ },
    ];
    for (const c of cases) {
      assert.ok(c.text !== spam, `${c.name} differs from the example`);
      const path = join(dir, c.name);
      await writeFile(path, c.text);
      const run = await hetps(['train-local', '--config', path, '--json'], 30_000);
      assert.notEqual(run.code, 0, `${c.name} should fail`);
      assert.match(run.stderr, /ConfigError/, c.name);
      assert.match(run.stderr, c.field, `${c.name}: ${run.stderr}`);
      assert.equal(run.stdout, '', `${c.name}: nothing on stdout`);
    }
    const epochs = await hetps(['train-local', '--config', 'examples/spam-local.yaml', '--epochs', '-1'], 30_000);
    assert.notEqual(epochs.code, 0);
    assert.match(epochs.stderr, /--epochs must be a positive integer/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('a missing dataset package is a MissingDependencyError naming data.source and the package', async () => {
  const config = parseConfig(await readFile(join(root, 'examples', 'spam-local.yaml'), 'utf8'), 'spam-local.yaml');
  assert.throws(
    () => dataSourceFromConfig(config, '@hetps/no-such-dataset'),
    (e: unknown) => e instanceof MissingDependencyError && /^data\.source spam: /.test(e.message) && /npm install @hetps\/no-such-dataset/.test(e.message),
  );
});
