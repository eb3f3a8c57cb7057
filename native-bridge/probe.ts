/**
 * Device benchmark kernels. `measureMatmulGflops` is the compute ceiling that
 * `hetps profile` reports and `bench/step.bench.ts` compares the step graphs with.
 */
import { performance } from 'node:perf_hooks';
import { SeededRandom } from '../runtime/random.ts';
import { ConfigError } from '../runtime/errors.ts';
import { f32, type MatmulProbeResult, type ModelGraph, type SessionOptions, type StepFeeds } from './native.ts';
import { GraphBuilder } from './onnx-builder.ts';
import { StepSession } from './session.ts';

/** Runs `session` for about `seconds` (at least 3 runs) after `warmup` untimed runs. */
export async function timeRuns(session: StepSession, feeds: StepFeeds, seconds: number, warmup = 2): Promise<{ runs: number; seconds: number }> {
  for (let i = 0; i < warmup; i++) await session.run(feeds);
  let runs = 0;
  const t0 = performance.now();
  let elapsed = 0;
  do {
    await session.run(feeds);
    runs++;
    elapsed = (performance.now() - t0) / 1000;
  } while (elapsed < seconds || runs < 3);
  return { runs, seconds: elapsed };
}

/** A graph of one [n, n] · [n, n] MatMul, both operands fed per run like a step graph's tensors. */
export function matmulGraph(size: number): ModelGraph {
  const g = new GraphBuilder(`hetps_matmul_${size}`);
  const a = g.input('a', 'float32', [size, size]);
  const b = g.input('b', 'float32', [size, size]);
  g.op('MatMul', [a, b], {}, 'c');
  g.output('c', 'float32', [size, size]);
  return { model: 'matmul', kind: 'eval', inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize() };
}

/**
 * Plain ONNX Runtime MatMul throughput in GFLOP/s (2·n³ per product), timed
 * for about `seconds` after a short warmup, through the same session path as
 * the step graphs (feeds in, output copied back).
 */
export async function measureMatmulGflops(
  size = 1024,
  seconds = 1,
  options: Partial<Pick<SessionOptions, 'provider' | 'intraOpNumThreads'>> = {},
): Promise<MatmulProbeResult> {
  if (!Number.isInteger(size) || size < 1) throw new ConfigError(`matmul probe size must be a positive integer, got ${size}`);
  if (!(seconds > 0)) throw new ConfigError(`matmul probe seconds must be > 0, got ${seconds}`);
  const session = await StepSession.create(matmulGraph(size), { ...options, graph: 'eval' });
  try {
    const rng = new SeededRandom(size);
    const fill = () => Float32Array.from({ length: size * size }, () => rng.normal());
    const feeds = { a: f32(fill(), [size, size]), b: f32(fill(), [size, size]) };
    const { runs: iterations, seconds: elapsed } = await timeRuns(session, feeds, seconds, 3);
    return { provider: session.options.provider, size, iterations, seconds: elapsed, gflops: (2 * size ** 3 * iterations) / elapsed / 1e9 };
  } finally {
    await session.dispose();
  }
}

/** A graph of one embedding Gather: table [rows, dim], ids [n] → [n, dim]. */
export function gatherGraph(rows: number, dim: number): ModelGraph {
  const g = new GraphBuilder(`hetps_gather_${rows}x${dim}`);
  const table = g.input('table', 'float32', [rows, dim]);
  const ids = g.input('ids', 'int32', ['n']);
  g.op('Gather', [table, ids], { axis: 0 }, 'rows');
  g.output('rows', 'float32', ['n', dim]);
  return { model: 'gather', kind: 'eval', inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize() };
}

/** Embedding rows gathered per second through ONNX Runtime (Zipf-free uniform ids: the cache-unfriendly case). */
export async function measureGatherRowsPerSecond(
  seconds = 0.5,
  opts: { rows?: number; dim?: number; batch?: number; provider?: SessionOptions['provider'] } = {},
): Promise<number> {
  const rows = opts.rows ?? 200_000, dim = opts.dim ?? 16, batch = opts.batch ?? 65_536;
  const session = await StepSession.create(gatherGraph(rows, dim), { provider: opts.provider ?? 'cpu', graph: 'eval' });
  try {
    const rng = new SeededRandom(rows ^ dim);
    const table = new Float32Array(rows * dim);
    for (let i = 0; i < table.length; i++) table[i] = rng.next();
    const ids = new Int32Array(batch);
    for (let i = 0; i < batch; i++) ids[i] = rng.int(rows);
    const feeds = { table: f32(table, [rows, dim]), ids: { dtype: 'int32' as const, dims: [batch], data: ids } };
    const { runs, seconds: elapsed } = await timeRuns(session, feeds, seconds, 2);
    return (runs * batch) / elapsed;
  } finally {
    await session.dispose();
  }
}
