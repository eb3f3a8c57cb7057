/**
 * `hetps export` at full scale: a checkpoint whose model does not fit in one
 * ONNX file (a protobuf message holds 2 GiB) goes through the real CLI, which
 * must move the large initializers to `<out>.data` by itself, check that
 * onnxruntime loads the pair, and move both into place.
 *
 * The checkpoint is written here (two shards, an embedding table of `--rows`
 * seen rows of dim 16, default 36 M: 2.3 GB of values, with their Adagrad
 * state), not trained: training 36 M rows is beyond this machine's budget,
 * and what is measured is the export. The exported pair is then scored on a
 * batch next to a small model exported inline from the same dense weights
 * and only the rows the batch touches: the predictions must be equal, which
 * shows the external data is read at the right offsets.
 *
 *   npm run bench:export            → bench/results/export.json
 *   options: --rows N (default 36000000)  --out FILE
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, statSync, writeFileSync, mkdirSync } from 'node:fs';
import { availableParallelism, cpus, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import * as ort from 'onnxruntime-node';
import {
  bucketCtrIds, createSyntheticCtrSource, ctrModel, exportedCtrFeeds, initDenseParams, streamOptions, type CtrBatch, type TableRows,
} from '../native-bridge/mod.ts';
import { encode } from '../runtime/mod.ts';
import type { ShardSnapshot } from '../actors/shard/shard.messages.ts';
import { writeCheckpoint } from '../actors/store/checkpoint.ts';
import { earlierResults, gitCommit } from './chaos.ts';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const argv = process.argv.slice(2);
const option = (name: string): string | null => { const i = argv.indexOf(name); return i >= 0 ? argv[i + 1] ?? null : null; };
// Hash buckets are per slot (slot s owns rows s·B … s·B + B − 1): every one of the 3·B rows is seen.
const SLOTS = 3;
const BUCKETS = Math.floor(Number(option('--rows') ?? 36_000_000) / SLOTS);
const ROWS = SLOTS * BUCKETS;
const OUT = option('--out') ?? join(ROOT, 'bench', 'results', 'export.json');
const say = (s: string) => process.stderr.write(`[export] ${s}\n`);
const DIM = 16; const DENSE = 2; const HIDDEN = [16];

/** Deterministic row values without a sine per element (36 M × 16 of them). */
function rowValue(i: number): number { return (((i * 2654435761) >>> 0) % 2001 - 1000) / 4000; }

function table(name: string, dim: number, ids: Uint32Array, values: Float32Array) {
  return { table: name, dim, stateSlots: 1, ids, values, state: new Float32Array(values.length).fill(0.01), steps: new Uint32Array(ids.length).fill(1) };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'hetps-bench-export-'));
  try {
    const model = ctrModel({ slots: SLOTS, embeddingDim: DIM, denseFeatures: DENSE, hidden: HIDDEN, pooling: 'mean' });
    const described = { type: 'ctr' as const, slots: SLOTS, embedding_dim: DIM, dense_features: DENSE, hidden: HIDDEN, pooling: 'mean' as const, wide: true, hash_buckets: BUCKETS };
    const dense = initDenseParams(model, 5);
    // Every id below ROWS is a seen row: shard a holds the even ids, b the odd ones; the dense parameters sit whole on shard a.
    say(`writing a checkpoint of ${ROWS} rows × ${DIM} (${((ROWS * DIM * 4) / 2 ** 30).toFixed(2)} GiB of values, as much again of optimizer state)`);
    const t0 = performance.now();
    const files = (['a', 'b'] as const).map((shard, s) => {
      const n = Math.floor((ROWS - s + 1) / 2);
      const ids = new Uint32Array(n);
      const emb = new Float32Array(n * DIM);
      const wide = new Float32Array(n);
      for (let k = 0; k < n; k++) {
        const id = 2 * k + s;
        ids[k] = id;
        for (let c = 0; c < DIM; c++) emb[k * DIM + c] = rowValue(id * DIM + c);
        wide[k] = rowValue(id + 7);
      }
      const snap: ShardSnapshot = {
        format: 1, shard, plan_version: 1, version: 1, round: 0, dense_optimizer: 'adam', sparse_optimizer: 'adagrad',
        dense: s === 0 ? model.denseParams.map((p, i) => ({ id: i, param: p.name, offset: 0, length: dense.get(p.name)!.length, values: dense.get(p.name)!, state: [], step: 1 })) : [],
        sparse: [table('emb', DIM, ids, emb), table('wide', 1, ids, wide)],
      };
      return { name: `${shard}.msgpack`, bytes: encode(snap), shard, version: 1, round: 0 };
    });
    const ck = await writeCheckpoint(join(dir, 'ckpts'), {
      files,
      manifest: {
        kind: 'full', chain: [], job: 'bench-export', run_id: 'r', trigger: 'api', plan: { version: 1, shards: ['a', 'b'], placement: null }, groups: null,
        optimizer: { dense: 'adam', sparse: 'adagrad' }, data: { total_batches: 0, acked: [] }, model: described,
      },
    });
    files.length = 0;
    const checkpointS = (performance.now() - t0) / 1000;
    say(`checkpoint ${ck.manifest.name}: ${(ck.manifest.bytes / 2 ** 30).toFixed(2)} GiB in ${checkpointS.toFixed(1)} s; running hetps export`);

    const out = join(dir, 'model.onnx');
    const t1 = performance.now();
    const printed = execFileSync(process.execPath, [join(ROOT, 'bin', 'hetps.mjs'), 'export', '--checkpoint', ck.path, '--out', out, '--json'],
      { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], maxBuffer: 16 * 2 ** 20 });
    const exportS = (performance.now() - t1) / 1000;
    const reported = JSON.parse(printed) as { bytes: number; external_data: { path: string; bytes: number } | null; rows: Record<string, number> };
    const modelBytes = statSync(out).size;
    const externalBytes = reported.external_data === null ? null : statSync(reported.external_data.path).size;
    say(`exported in ${exportS.toFixed(1)} s: model ${modelBytes} B, external data ${externalBytes} B`);

    // Score one batch with the exported pair and with a small inline model of the rows it touches.
    const src = createSyntheticCtrSource({ seed: 3, slots: SLOTS, vocabularyPerSlot: 5000, zipfExponent: 1.05, denseDim: DENSE, trainSize: 256, testSize: 256 });
    const batch = src.batchesSync(streamOptions('test', 256, { shuffle: false })).next().value as CtrBatch;
    const keys = [...new Set(bucketCtrIds(batch.offsets, batch.ids, SLOTS, BUCKETS))].sort((x, y) => x - y);
    const rowsOf = (d: number, salt: number): TableRows => ({
      ids: Uint32Array.from(keys),
      values: Float32Array.from({ length: keys.length * d }, (_, j) => rowValue(d === DIM ? keys[Math.floor(j / d)]! * DIM + (j % d) : keys[j]! + salt)),
    });
    const small = model.exportGraph({ dense, emb: rowsOf(DIM, 0), wide: rowsOf(1, 7), hashBuckets: BUCKETS });
    const t2 = performance.now();
    const big = await ort.InferenceSession.create(out);
    const loadS = (performance.now() - t2) / 1000;
    const feeds = exportedCtrFeeds(batch, true);
    const got = (await big.run(feeds))['predictions']!.data as Float32Array;
    await big.release();
    const ref = await ort.InferenceSession.create(small.bytes);
    const want = (await ref.run(feeds))['predictions']!.data as Float32Array;
    await ref.release();
    let maxDiff = 0;
    for (let i = 0; i < want.length; i++) maxDiff = Math.max(maxDiff, Math.abs(got[i]! - want[i]!));
    const { commit, dirty } = gitCommit(ROOT);
    const result = {
      benchmark: 'export', commit, dirty, date: new Date().toISOString(),
      machine: { cpu: cpus()[0]?.model ?? null, cores: availableParallelism(), memory_gib: Math.round(totalmem() / 2 ** 30), node: process.version, platform: `${process.platform} ${process.arch}` },
      setup: `a checkpoint written directly (not trained): 2 shards, ${ROWS} seen rows of dim ${DIM} with Adagrad state, a wide table, a [${HIDDEN}] tower; exported by \`hetps export --json\` with no external-data flag`,
      rows: ROWS, checkpoint_bytes: ck.manifest.bytes, checkpoint_write_s: +checkpointS.toFixed(1),
      model_bytes: modelBytes, external_data_bytes: externalBytes, export_s: +exportS.toFixed(1), load_s: +loadS.toFixed(1),
      scored: { samples: want.length, rows_touched: keys.length, max_abs_diff_vs_inline: maxDiff },
      met: { external_data_written: externalBytes !== null && externalBytes > 2 ** 31, predictions_equal: maxDiff < 1e-6 },
      superseded: earlierResults(OUT),
    };
    mkdirSync(join(OUT, '..'), { recursive: true });
    writeFileSync(OUT, `${JSON.stringify(result, null, 2)}\n`);
    say(`wrote ${OUT}: ${JSON.stringify(result.met)}, max |diff| ${maxDiff}`);
    if (!result.met.external_data_written || !result.met.predictions_equal) process.exitCode = 1;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
