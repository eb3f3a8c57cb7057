/**
 * `hetps export --checkpoint DIR --out model.onnx`: a checkpoint's trained
 * weights and seen embedding rows as one self-contained ONNX inference
 * graph, checked to load in onnxruntime-node before it is written
 * (atomically). A model over 2 GiB (a protobuf limit) keeps its large
 * initializers in `model.onnx.data` next to it (ONNX external data), as
 * does any model with `--external-data-above BYTES`. `hetps eval --model model.onnx --config X`: that file
 * scored on the config's test split by plain ONNX Runtime — the metrics of
 * the job's summary.
 */
import type { Command } from 'commander';
import { mkdtemp, open, readFile, rename, rm, stat } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import * as ort from 'onnxruntime-node';
import { ConfigError } from '../runtime/errors.ts';
import { loadConfig } from '../topology/mod.ts';
import { evaluateExported, onnxMetadata } from '../native-bridge/mod.ts';
import { checkpointModelOf } from '../actors/node/config-bridge.ts';
import { modelAndData } from '../actors/node/nodes.ts';
import { EVAL_BATCH_MIN } from '../actors/monitor/evaluate.ts';
import { newestValidCheckpoint, type CheckpointModel } from '../actors/store/checkpoint.ts';
import { exportCheckpoint } from '../actors/store/checkpoint-export.ts';

const mib = (bytes: number) => `${(bytes / 2 ** 20).toFixed(2)} MiB`;

/** `chunks` written to `file` in order and fsynced. */
async function writeDurably(file: string, chunks: readonly Uint8Array[]): Promise<void> {
  const h = await open(file, 'w');
  try {
    for (const c of chunks) {
      for (let at = 0; at < c.byteLength;) at += (await h.write(c, at, Math.min(c.byteLength - at, 1 << 30))).bytesWritten;
    }
    await h.sync();
  } finally {
    await h.close();
  }
}

/** DIR itself when it is one checkpoint; a checkpoint root: its newest checkpoint that verifies (saying which, and what was refused). */
async function checkpointDir(dir: string, say: (line: string) => void): Promise<string> {
  const s = await stat(dir).catch(() => null);
  if (s === null || !s.isDirectory()) throw new ConfigError(`--checkpoint ${dir} is not a directory; give a checkpoint directory (or a checkpoint root: its newest usable checkpoint is used)`);
  if (await stat(join(dir, 'manifest.json')).catch(() => null)) return resolve(dir);
  const found = await newestValidCheckpoint(dir);
  for (const r of found?.refused ?? []) say(`export: refused checkpoint ${r.path}: ${r.reason}; trying the one before it`);
  if (found === null) {
    throw new ConfigError(`--checkpoint ${dir} holds no usable checkpoint; give one checkpoint directory, or a job's checkpoint root (checkpoint.dir/<job name>; hetps checkpoint verify says why one is not usable)`);
  }
  say(`export: ${dir} is a checkpoint root; using its newest usable checkpoint ${found.path}`);
  return found.path;
}

/** Fields where two model descriptions differ, as `field: a ≠ b`. */
function modelDifferences(a: CheckpointModel, b: CheckpointModel): string[] {
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  const out: string[] = [];
  for (const k of keys) {
    const x = JSON.stringify((a as Record<string, unknown>)[k]); const y = JSON.stringify((b as Record<string, unknown>)[k]);
    if (x !== y) out.push(`${k}: ${x} in the model, ${y} in the config`);
  }
  return out;
}

export function register(program: Command): void {
  program
    .command('export')
    .description('write a checkpoint\'s trained model as one ONNX inference graph (dense weights and the embedding rows seen in training), scored by plain onnxruntime')
    .requiredOption('--checkpoint <dir>', 'a checkpoint directory (a delta brings its chain), or a checkpoint root: its newest usable checkpoint')
    .requiredOption('--out <file>', 'the .onnx file to write')
    .option('--config <file>', 'the job\'s config: only for a checkpoint that does not record its model (written by an older hetps)')
    .option('--external-data-above <bytes>', 'write every initializer of at least this many bytes to <out>.data (ONNX external data); default: only when the model would exceed 2 GiB')
    .option('--json', 'print { path, checkpoint, job, model, rows, bytes, external_data, inputs, outputs } on stdout', false)
    .action(async (flags: { checkpoint: string; out: string; config?: string; externalDataAbove?: string; json: boolean }) => {
      const externalAbove = flags.externalDataAbove === undefined ? null : Number(flags.externalDataAbove);
      if (externalAbove !== null && !(Number.isInteger(externalAbove) && externalAbove >= 1)) {
        throw new ConfigError(`--external-data-above must be a whole number of bytes ≥ 1, got ${JSON.stringify(flags.externalDataAbove)}`, { data: { field: '--external-data-above' } });
      }
      const say = (line: string) => process.stderr.write(`${line}\n`);
      const dir = await checkpointDir(flags.checkpoint, say);
      let fallback: CheckpointModel | null = null;
      if (flags.config !== undefined) {
        const config = await loadConfig(flags.config);
        fallback = checkpointModelOf(config, modelAndData(config).model);
      }
      say(`export: reading ${dir} (and its chain), building the inference graph`);
      const t0 = Date.now();
      const out = resolve(flags.out);
      const location = `${basename(out)}.data`;
      const { graph, manifest, model, rows } = await exportCheckpoint(dir, fallback, { externalLocation: location, externalAbove });
      const ext = graph.external ?? null;
      say(`export: ${Object.entries(rows).map(([t, n]) => `${n} ${t} rows`).join(', ') || 'dense parameters only'}, ${mib(graph.bytes.byteLength)}`
        + `${ext ? ` + ${mib(ext.bytes)} of external data (${location})` : ''} in ${((Date.now() - t0) / 1000).toFixed(1)} s; checking that onnxruntime loads it`);
      // Written under a temporary directory next to the target with their final names (the model names its data file),
      // loaded from there by plain ONNX Runtime — what the user will do first — and only then moved into place.
      const tmpDir = await mkdtemp(join(dirname(out), `.${basename(out)}.tmp-`));
      try {
        const tmpModel = join(tmpDir, basename(out));
        await writeDurably(tmpModel, [graph.bytes]);
        if (ext) await writeDurably(join(tmpDir, location), ext.chunks);
        const check = await ort.InferenceSession.create(tmpModel);
        await check.release();
        if (ext) await rename(join(tmpDir, location), join(dirname(out), location));
        await rename(tmpModel, out);
      } finally {
        await rm(tmpDir, { recursive: true, force: true });
      }
      const externalData = ext ? { path: join(dirname(out), location), bytes: ext.bytes } : null;
      const inputs = graph.inputs.map((i) => ({ name: i.name, dtype: i.dtype, dims: i.dims, doc: i.doc }));
      const outputs = graph.outputs.map((i) => ({ name: i.name, dtype: i.dtype, dims: i.dims, doc: i.doc }));
      if (flags.json) {
        process.stdout.write(`${JSON.stringify({ path: out, checkpoint: dir, job: manifest.job, model, rows, bytes: graph.bytes.byteLength, external_data: externalData, inputs, outputs })}\n`);
        return;
      }
      const rowText = Object.entries(rows).map(([t, n]) => `${n} ${t} rows`).join(', ');
      process.stdout.write(`exported ${manifest.name} (job ${manifest.job}, ${model.type}${rowText ? `, ${rowText}` : ''}) to ${out}, ${mib(graph.bytes.byteLength)}${externalData ? ` (+ ${externalData.path}, ${mib(externalData.bytes)}: keep the two together)` : ''}\n`
        + `inputs: ${inputs.map((i) => `${i.name} ${i.dtype} [${i.dims.join(', ')}]`).join('; ')}\n`
        + `output: ${outputs.map((i) => `${i.name} ${i.dtype} [${i.dims.join(', ')}]`).join('; ')}\n`
        + `score the test split with: hetps eval --model ${flags.out} --config <the job's config>\n`);
    });

  program
    .command('eval')
    .description('score the config\'s test split with an exported ONNX model through plain onnxruntime: AUC and log loss (ctr), accuracy and cross-entropy (mlp)')
    .requiredOption('--model <file>', 'an .onnx file written by hetps export')
    .requiredOption('--config <file>', 'the job\'s config: its data section gives the test split')
    .option('--threads <n>', 'ONNX Runtime threads per operator (default: every CPU)')
    .option('--json', 'print { model, config, kind, auc | accuracy, logloss, samples } on stdout', false)
    .action(async (flags: { model: string; config: string; threads?: string; json: boolean }) => {
      const threads = flags.threads === undefined ? null : Number(flags.threads);
      if (threads !== null && !(Number.isInteger(threads) && threads >= 1)) throw new ConfigError(`--threads must be a positive integer, got ${flags.threads}`);
      const bytes = await readFile(flags.model).catch((e: NodeJS.ErrnoException) => {
        throw new ConfigError(`--model ${flags.model}: ${e.code === 'ENOENT' ? 'no such file; write one with hetps export --checkpoint DIR --out FILE' : e.message}`);
      });
      const config = await loadConfig(flags.config);
      const { source, model } = modelAndData(config);
      let recorded: CheckpointModel | null = null;
      try {
        const meta = onnxMetadata(bytes)['hetps.model'];
        recorded = meta === undefined ? null : JSON.parse(meta) as CheckpointModel;
      } catch (e) {
        throw new ConfigError(`--model ${flags.model} is not an ONNX model (${(e as Error).message})`);
      }
      if (recorded !== null) {
        const diff = modelDifferences(recorded, checkpointModelOf(config, model));
        if (diff.length > 0) throw new ConfigError(`--model ${flags.model} was not trained with the model of ${flags.config} (${diff.join('; ')}); give the config of the job it was trained by`);
      }
      let last = Date.now();
      const total = source.describe().testSize;
      // From the file: a model with external data finds it next to itself.
      const evaluation = await evaluateExported(resolve(flags.model), source, {
        batchSize: Math.max(config.data.batch_size, EVAL_BATCH_MIN), threads, inputWidth: model.family === 'mlp' ? (model as { inputWidth: number }).inputWidth : null,
        onBatch: (n) => { if (!flags.json && Date.now() - last > 2_000) { last = Date.now(); process.stderr.write(`eval: ${n}/${total} test samples\n`); } },
      });
      const result = { model: resolve(flags.model), config: resolve(flags.config), ...evaluation };
      if (flags.json) { process.stdout.write(`${JSON.stringify(result)}\n`); return; }
      process.stdout.write(evaluation.kind === 'ctr'
        ? `test AUC ${evaluation.auc.toFixed(4)}, log loss ${evaluation.logloss.toFixed(4)} over ${evaluation.samples} samples\n`
        : `test accuracy ${evaluation.accuracy.toFixed(4)}, cross-entropy ${evaluation.logloss.toFixed(4)} over ${evaluation.samples} samples\n`);
    });
}
