/**
 * Device benchmark kernels. `measureMatmulGflops` is the compute ceiling that
 * `hetps profile` reports and `bench/step.bench.ts` compares the step graphs with.
 */
import { performance } from 'node:perf_hooks';
import { SeededRandom } from '../runtime/random.ts';
import { ConfigError } from '../runtime/errors.ts';
import { f32, type MatmulProbeResult, type ModelGraph, type SessionOptions } from './native.ts';
import { GraphBuilder } from './onnx-builder.ts';
import { StepSession } from './session.ts';

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
    for (let i = 0; i < 3; i++) await session.run(feeds);
    let iterations = 0;
    const t0 = performance.now();
    let elapsed = 0;
    do {
      await session.run(feeds);
      iterations++;
      elapsed = (performance.now() - t0) / 1000;
    } while (elapsed < seconds || iterations < 3);
    return { provider: session.options.provider, size, iterations, seconds: elapsed, gflops: (2 * size ** 3 * iterations) / elapsed / 1e9 };
  } finally {
    await session.dispose();
  }
}
