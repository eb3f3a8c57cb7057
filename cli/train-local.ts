/**
 * `hetps train-local --config FILE`: the config's model trained on its data in
 * this one process, no NATS — the single-process reference that distributed
 * runs are compared against. Only `model`, `data`, `optimizer` and
 * `training.random_seed` are read; `cluster`, `nats`, `nodes` and the rest
 * describe a distributed job and are ignored here.
 */
import type { Command } from 'commander';
import { performance } from 'node:perf_hooks';
import { ConfigError } from '../runtime/errors.ts';
import { ProgressLine } from './progress.ts';
import { loadConfig } from '../topology/mod.ts';
import { LocalTrainer, type EpochProgress, type Evaluation, type ExecutionProvider } from '../native-bridge/mod.ts';
import { EMBEDDING_INIT_SCALE, dataSourceFromConfig, modelFromConfig, optimizersFromConfig } from '../actors/node/config-bridge.ts';

// The config → native-bridge helpers moved to actors/node/config-bridge.ts; re-exported for existing callers.
export { dataSourceFromConfig, modelFromConfig, optimizerInput } from '../actors/node/config-bridge.ts';

/** Evaluation batches are larger than training ones: no gradients, fewer session calls. */
const EVAL_BATCH_MIN = 512;

// ---------------------------------------------------------------- progress

/** One epoch's progress as the bar's text. */
function epochText(p: EpochProgress, epochs: number, elapsedS: number): string {
  const rate = elapsedS > 0 ? p.samples / elapsedS : 0;
  const pct = p.totalSamples === 0 ? 100 : Math.floor((100 * p.samples) / p.totalSamples);
  return `epoch ${p.epoch + 1}/${epochs}: ${pct}%  ${p.samples}/${p.totalSamples} samples  loss ${p.meanLoss.toFixed(4)}  ${Math.round(rate)} samples/s`;
}

// ---------------------------------------------------------------- the command

export interface TrainLocalResult {
  model: string;
  data: string;
  epochs: number;
  /** null for mlp. */
  test_auc: number | null;
  /** Binary log loss (ctr) or softmax cross-entropy (mlp) on the test split. */
  test_logloss: number;
  /** mlp only. */
  test_accuracy?: number;
  train_logloss: number;
  /** Training samples processed, all epochs. */
  samples: number;
  /** samples / training seconds (evaluation and start-up excluded). */
  samples_per_s: number;
  train_s: number;
  /** Whole command: data loading, sessions, training, evaluation. */
  wall_s: number;
  history: { epoch: number; train_logloss: number; test_logloss: number; test_auc: number | null; test_accuracy: number | null; seconds: number }[];
}

interface TrainLocalFlags { config: string; json: boolean; epochs?: string; provider: string; threads?: string }

function positiveIntFlag(name: string, value: string | undefined): number | null {
  if (value === undefined) return null;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new ConfigError(`${name} must be a positive integer, got ${JSON.stringify(value)}`, { data: { field: name } });
  return n;
}

function describeEval(e: Evaluation): string {
  return e.kind === 'ctr'
    ? `test logloss ${e.logloss.toFixed(4)}  test AUC ${e.auc.toFixed(4)}`
    : `test cross-entropy ${e.logloss.toFixed(4)}  test accuracy ${(e.accuracy * 100).toFixed(2)}%`;
}

export async function trainLocal(flags: TrainLocalFlags): Promise<TrainLocalResult> {
  const t0 = performance.now();
  const epochsFlag = positiveIntFlag('--epochs', flags.epochs);
  const threads = positiveIntFlag('--threads', flags.threads);
  if (flags.provider !== 'cpu' && flags.provider !== 'cuda') throw new ConfigError(`--provider must be cpu or cuda, got ${JSON.stringify(flags.provider)}`, { data: { field: '--provider' } });
  const config = await loadConfig(flags.config);
  const epochs = epochsFlag ?? config.data.epochs;
  const human = flags.json ? process.stderr : process.stdout;
  const progress = new ProgressLine(process.stderr, { plainEveryMs: 10_000 });

  const source = dataSourceFromConfig(config);
  const model = modelFromConfig(config, source);
  const { dense: denseOptimizer, sparse: sparseOptimizer } = optimizersFromConfig(config, model);
  const ctr = config.model.ctr;
  const trainer = await LocalTrainer.create({
    model, denseOptimizer, sparseOptimizer,
    seed: config.training.random_seed,
    provider: flags.provider as ExecutionProvider,
    intraOpNumThreads: threads,
    embeddingInitScale: EMBEDDING_INIT_SCALE,
    wide: ctr?.wide ?? false,
    hashBuckets: ctr?.hash_buckets ?? null,
  });
  try {
    const desc = source.describe();
    // spam: `samples` caps the training mails per epoch; synthetic sources were generated at that size.
    const maxSamples = config.data.source === 'spam' ? config.data.samples : null;
    const batchSize = config.data.batch_size;
    const evalBatch = Math.max(batchSize, EVAL_BATCH_MIN);
    const params = model.denseParams.reduce((n, p) => n + p.dims.reduce((a, b) => a * b, 1), 0);
    progress.line(`train-local: ${model.family} on ${desc.name} (${desc.trainSize} train / ${desc.testSize} test samples), ${params} dense parameters, `
      + `batch ${batchSize}, ${epochs} epoch${epochs === 1 ? '' : 's'}, ${denseOptimizer.config.type}${sparseOptimizer ? ` + ${sparseOptimizer.config.type} for rows` : ''}; one process, no NATS`);

    let samples = 0; let trainS = 0;
    const history: TrainLocalResult['history'] = [];
    let last: { train: number; evaluation: Evaluation } | null = null;
    for (let epoch = 0; epoch < epochs; epoch++) {
      const e0 = performance.now();
      const summary = await trainer.trainEpoch(source, {
        epoch, batchSize, maxSamples,
        onBatch: (p) => progress.update(epochText(p, epochs, (performance.now() - e0) / 1000), p.totalSamples === 0 ? 1 : p.samples / p.totalSamples),
      });
      const epochTrainS = (performance.now() - e0) / 1000;
      trainS += epochTrainS;
      samples += summary.samples;
      progress.end();
      const evaluation = await trainer.evaluate(source, evalBatch);
      const seconds = (performance.now() - e0) / 1000;
      history.push({
        epoch: epoch + 1, train_logloss: summary.trainLoss, test_logloss: evaluation.logloss,
        test_auc: evaluation.kind === 'ctr' ? evaluation.auc : null, test_accuracy: evaluation.kind === 'mlp' ? evaluation.accuracy : null, seconds,
      });
      human.write(`epoch ${epoch + 1}/${epochs}: train ${model.family === 'ctr' ? 'logloss' : 'cross-entropy'} ${summary.trainLoss.toFixed(4)}  ${describeEval(evaluation)}  `
        + `(${summary.samples} samples, ${Math.round(summary.samples / epochTrainS)} samples/s, ${seconds.toFixed(1)} s)\n`);
      last = { train: summary.trainLoss, evaluation };
    }
    const wallS = (performance.now() - t0) / 1000;
    const ev = last!.evaluation;
    const result: TrainLocalResult = {
      model: model.family,
      data: config.data.source,
      epochs,
      test_auc: ev.kind === 'ctr' ? ev.auc : null,
      test_logloss: ev.logloss,
      ...(ev.kind === 'mlp' ? { test_accuracy: ev.accuracy } : {}),
      train_logloss: last!.train,
      samples,
      samples_per_s: trainS > 0 ? samples / trainS : 0,
      train_s: trainS,
      wall_s: wallS,
      history,
    };
    return result;
  } finally {
    await trainer.dispose();
  }
}

export function register(program: Command): void {
  program
    .command('train-local')
    .description('train the config\'s model on its data in this one process (no NATS): the single-process reference for distributed runs')
    .requiredOption('--config <file>', 'job YAML (model, data, optimizer, training.random_seed are used)')
    .option('--epochs <n>', 'override data.epochs')
    .option('--provider <p>', 'execution provider: cpu or cuda', 'cpu')
    .option('--threads <n>', 'ONNX Runtime threads per operator (default: every CPU)')
    .option('--json', 'print one JSON object with the final metrics on stdout (progress and epoch lines go to stderr)', false)
    .action(async (flags: TrainLocalFlags) => {
      const r = await trainLocal(flags);
      if (flags.json) {
        process.stdout.write(`${JSON.stringify(r)}\n`);
        return;
      }
      const metric = r.test_auc !== null ? `test AUC ${r.test_auc.toFixed(4)}` : `test accuracy ${((r.test_accuracy ?? NaN) * 100).toFixed(2)}%`;
      process.stdout.write(`done: ${metric}, test logloss ${r.test_logloss.toFixed(4)}; ${r.samples} samples in ${r.train_s.toFixed(1)} s of training `
        + `(${Math.round(r.samples_per_s)} samples/s), ${r.wall_s.toFixed(1)} s in all\n`);
    });
}
