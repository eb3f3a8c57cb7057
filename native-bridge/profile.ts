/**
 * The device profile a node publishes when it joins: what grouping clusters
 * on. Matmul and gather go through ONNX Runtime, the same path a training
 * step takes; `variance` is the coefficient of variation of repeated matmul
 * runs, so a node that is fast but erratic (shared, throttled) shows it.
 */
import { availableParallelism, totalmem } from 'node:os';
import type { ExecutionProvider } from './native.ts';
import { measureGatherRowsPerSecond, measureMatmulGflops } from './probe.ts';
import { providerListed } from './session.ts';

export interface DeviceProfile {
  node: string;
  matmul_gflops: number;
  gather_rows_per_s: number;
  memory_gb: number;
  cpus: number;
  providers: ExecutionProvider[];
  variance: number;
}

export interface ProfileOptions {
  node: string;
  provider: ExecutionProvider;
  /** Matmul repetitions for the variance estimate. */
  repeats: number;
  /** Seconds per matmul repetition. */
  secondsPerRepeat: number;
  matmulSize: number;
  onProgress: ((step: string) => void) | null;
}

export function coefficientOfVariation(xs: readonly number[]): number {
  if (xs.length < 2) return 0;
  const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
  if (mean === 0) return 0;
  const sd = Math.sqrt(xs.reduce((a, b) => a + (b - mean) ** 2, 0) / (xs.length - 1));
  return sd / mean;
}

export async function profileDevice(opts: Partial<ProfileOptions> & { node: string }): Promise<DeviceProfile> {
  const o: ProfileOptions = { provider: 'cpu', repeats: 5, secondsPerRepeat: 0.3, matmulSize: 512, onProgress: null, ...opts };
  const runs: number[] = [];
  for (let i = 0; i < o.repeats; i++) {
    o.onProgress?.(`matmul ${i + 1}/${o.repeats}`);
    runs.push((await measureMatmulGflops(o.matmulSize, o.secondsPerRepeat, { provider: o.provider })).gflops);
  }
  o.onProgress?.('embedding gather');
  const gather = await measureGatherRowsPerSecond(o.secondsPerRepeat, { provider: o.provider });
  const sorted = [...runs].sort((a, b) => a - b);
  return {
    node: o.node,
    // The median: one preempted run should not make a node look slow.
    matmul_gflops: +sorted[Math.floor(sorted.length / 2)]!.toFixed(2),
    gather_rows_per_s: Math.round(gather),
    memory_gb: +(totalmem() / 2 ** 30).toFixed(2),
    cpus: availableParallelism(),
    providers: (['cpu', 'cuda'] as const).filter((p) => providerListed(p)),
    variance: +coefficientOfVariation(runs).toFixed(4),
  };
}
