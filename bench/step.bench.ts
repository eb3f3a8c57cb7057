/**
 * Step-graph throughput: samples/s of the mlp and ctr training steps at
 * batch 64, 256 and 1024, and for mlp the achieved GFLOP/s against plain
 * ONNX Runtime MatMul GFLOP/s measured in the same run (the ceiling).
 *
 *   node --import tsx bench/step.bench.ts [--seconds 2] [--threads N]
 *
 * Writes bench/results/step.json.
 *
 * Shared and virtual machines drift by 2-3x within seconds, so each number is
 * the best of ROUNDS short timings, and for mlp the MatMul ceiling is timed in
 * the same rounds, interleaved with the step, so both see the same machine.
 */
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import {
  ctrModel, initDenseParams, measureMatmulGflops, mlpModel, StepSession, syntheticCtrFeeds, syntheticMlpFeeds, timeRuns,
  type HostTensor,
} from '../native-bridge/mod.ts';

const { values } = parseArgs({ options: { seconds: { type: 'string', default: '2' }, threads: { type: 'string' } } });
const seconds = Number(values.seconds);
const threads = values.threads === undefined ? availableParallelism() : Number(values.threads);
const BATCHES = [64, 256, 1024] as const;
const ROUNDS = 5;

/** Steps per second over `budget` seconds (at least 3 steps), after a short warmup. */
async function timeSteps(session: StepSession, feeds: Record<string, HostTensor>, budget: number): Promise<number> {
  const { runs, seconds } = await timeRuns(session, feeds, budget, 2);
  return runs / seconds;
}

/** Best steps/s (and best MatMul GFLOP/s when `withMatmul`) over ROUNDS rounds sharing `seconds`. */
async function bestOfRounds(session: StepSession, feeds: Record<string, HostTensor>, withMatmul: boolean): Promise<{ stepsPerS: number; matmulGflops: number }> {
  let stepsPerS = 0; let matmulGflops = 0;
  for (let r = 0; r < ROUNDS; r++) {
    if (withMatmul) {
      const probe = await measureMatmulGflops(1024, (0.4 * seconds) / ROUNDS, { intraOpNumThreads: threads });
      matmulGflops = Math.max(matmulGflops, probe.gflops);
    }
    stepsPerS = Math.max(stepsPerS, await timeSteps(session, feeds, seconds / ROUNDS));
  }
  return { stepsPerS, matmulGflops };
}

console.log(`${threads} intra-op threads, best of ${ROUNDS} rounds, ~${seconds} s per configuration`);
const mlp = mlpModel();
const mlpSession = await StepSession.create(mlp, { intraOpNumThreads: threads });
const mlpParams = initDenseParams(mlp, 1);
const mlpRows: { batch: number; samples_per_s: number; gflops: number; matmul_gflops: number; ratio: number }[] = [];
for (const batch of BATCHES) {
  const { stepsPerS, matmulGflops } = await bestOfRounds(mlpSession, syntheticMlpFeeds(mlp, mlpParams, batch, batch), true);
  const gflops = (stepsPerS * batch * mlp.stepFlopsPerSample()) / 1e9;
  mlpRows.push({ batch, samples_per_s: stepsPerS * batch, gflops, matmul_gflops: matmulGflops, ratio: gflops / matmulGflops });
  console.log(`mlp ${mlp.config.layers.join('→')} batch ${batch}: ${(stepsPerS * batch).toFixed(0)} samples/s, ${gflops.toFixed(1)} GFLOP/s; MatMul 1024³ ${matmulGflops.toFixed(1)} GFLOP/s; ratio ${(gflops / matmulGflops).toFixed(2)}`);
}
await mlpSession.dispose();

const ctr = ctrModel();
const ctrSession = await StepSession.create(ctr, { intraOpNumThreads: threads });
const ctrParams = initDenseParams(ctr, 2);
const ctrRows: { batch: number; samples_per_s: number }[] = [];
for (const batch of BATCHES) {
  // ~2 ids per bag (0..4, so some bags are empty), half of the batch's ids are distinct rows.
  const ids = batch * ctr.config.slots * 2;
  const feeds = syntheticCtrFeeds(ctr, ctrParams, { batch, uniqueRows: Math.ceil(ids / 2), meanBagSize: 2, emptyBags: true }, batch);
  const { stepsPerS } = await bestOfRounds(ctrSession, feeds, false);
  ctrRows.push({ batch, samples_per_s: stepsPerS * batch });
  console.log(`ctr ${ctr.config.slots} slots × D${ctr.config.embeddingDim}, F${ctr.config.denseFeatures}, hidden [${ctr.config.hidden.join(', ')}], ${ctr.config.pooling} pooling, batch ${batch} (${feeds['bag_rows']!.data.length} ids, ${feeds['emb_rows']!.dims[0]} rows): ${(stepsPerS * batch).toFixed(0)} samples/s`);
}
await ctrSession.dispose();

/** fp16 gradient encoding throughput, when native-bridge/fp16.ts exists (MB/s of float32 input). */
async function measureFp16EncodeMbPerS(): Promise<number | null> {
  const url = new URL('../native-bridge/fp16.ts', import.meta.url);
  if (!existsSync(fileURLToPath(url))) return null;
  const mod = (await import(url.href)) as { encodeFp16?: unknown };
  if (typeof mod.encodeFp16 !== 'function') return null;
  const encode = mod.encodeFp16 as (values: Float32Array, dst: Uint16Array) => unknown;
  const input = Float32Array.from({ length: 1 << 22 }, (_, i) => Math.sin(i) * 100);
  const dst = new Uint16Array(input.length);
  for (let i = 0; i < 3; i++) encode(input, dst);
  let n = 0;
  const t0 = performance.now();
  let elapsed = 0;
  do { encode(input, dst); n++; elapsed = (performance.now() - t0) / 1000; } while (elapsed < seconds || n < 3);
  return (n * input.byteLength) / elapsed / 1e6;
}
const fp16 = await measureFp16EncodeMbPerS();
console.log(`fp16 encode: ${fp16 === null ? 'native-bridge/fp16.ts not present' : `${fp16.toFixed(0)} MB/s`}`);

const dir = fileURLToPath(new URL('./results/', import.meta.url));
mkdirSync(dir, { recursive: true });
writeFileSync(`${dir}step.json`, `${JSON.stringify({ mlp: mlpRows, ctr: ctrRows, fp16_encode_mb_per_s: fp16 }, null, 2)}\n`);
console.log(`wrote ${dir}step.json`);
