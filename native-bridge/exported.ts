/**
 * Scoring with an exported inference graph (`CtrModel.exportGraph`,
 * `MlpModel.exportGraph`) through plain ONNX Runtime: an `InferenceSession`
 * of the file's bytes and the raw test samples, nothing of hetps' own
 * session or shards — what a user serving the model does. `hetps eval`
 * reports the metrics the job's summary does (AUC and log loss, or accuracy
 * and cross-entropy) over the same test split.
 */
import * as ort from 'onnxruntime-node';
import onnxProto from 'onnx-proto';
import { ConfigError, InvalidTensorError } from '../runtime/errors.ts';
import { streamOptions, type CtrBatch, type DataSource } from './data/batch.ts';
import { BinaryTally, hashedBagOfIds, MulticlassTally, type Evaluation } from './local-trainer.ts';

/** The feeds of an exported ctr graph for one batch: every id (as unsigned 32-bit, in int64), the bag sizes, the dense features. */
export function exportedCtrFeeds(batch: CtrBatch, withDense: boolean): Record<string, ort.Tensor> {
  const bags = batch.offsets.length - 1;
  const counts = new Int32Array(bags);
  for (let i = 0; i < bags; i++) counts[i] = batch.offsets[i + 1]! - batch.offsets[i]!;
  const ids = new BigInt64Array(batch.ids.length);
  for (let k = 0; k < ids.length; k++) ids[k] = BigInt(batch.ids[k]! >>> 0);
  const feeds: Record<string, ort.Tensor> = {
    ids: new ort.Tensor('int64', ids, [ids.length]),
    bag_counts: new ort.Tensor('int32', counts, [batch.size, batch.slots]),
  };
  if (withDense) {
    if (batch.dense === null) throw new InvalidTensorError(`batch ${batch.batchId} has no dense features, the exported model takes ${batch.denseDim}`, { data: { input: 'dense_features' } });
    feeds['dense_features'] = new ort.Tensor('float32', batch.dense, [batch.size, batch.denseDim]);
  }
  return feeds;
}

/** `metadata_props` of an ONNX file (protobuf-decoded; onnxruntime-node does not expose them). */
export function onnxMetadata(bytes: Uint8Array): Record<string, string> {
  const m = onnxProto.onnx.ModelProto.decode(bytes);
  return Object.fromEntries((m.metadataProps ?? []).map((p) => [p.key ?? '', p.value ?? '']));
}

/**
 * The test split of `source` scored by the exported graph in `bytes`:
 * a ctr graph (inputs `ids`, `bag_counts`, maybe `dense_features`) gives AUC
 * and log loss, an mlp graph (input `x`) accuracy and cross-entropy.
 * `onBatch` is called after each batch with the samples scored so far.
 */
export async function evaluateExported(model: Uint8Array | string, source: DataSource, o: {
  batchSize: number; threads: number | null;
  /** An mlp's input width, to hash token batches into features as the trainer does (`hashedBagOfIds`); null: not an mlp. */
  inputWidth: number | null;
  onBatch?: (samples: number) => void;
}): Promise<Evaluation> {
  // A file path lets ONNX Runtime find a model's external data next to it.
  const options: ort.InferenceSession.SessionOptions = {
    executionProviders: ['cpu'], graphOptimizationLevel: 'all', ...(o.threads === null ? {} : { intraOpNumThreads: o.threads }),
  };
  const session = typeof model === 'string' ? await ort.InferenceSession.create(model, options) : await ort.InferenceSession.create(model, options);
  try {
    const inputs = new Set(session.inputNames);
    const stream = streamOptions('test', o.batchSize, { shuffle: false });
    if (inputs.has('ids') && inputs.has('bag_counts')) {
      const withDense = inputs.has('dense_features');
      const tally = new BinaryTally();
      for (const batch of source.batchesSync(stream)) {
        if (batch.kind !== 'ctr') throw new ConfigError(`the exported model is a ctr model (inputs ids, bag_counts), the data source gives ${batch.kind} batches; give the config of the job it was trained by`);
        tally.add(batch.labels, (await session.run(exportedCtrFeeds(batch, withDense)))['predictions']!.data as Float32Array, batch.size);
        o.onBatch?.(tally.samples);
      }
      return tally.result();
    }
    if (inputs.has('x')) {
      let tally: MulticlassTally | null = null;
      let n = 0;
      for (const batch of source.batchesSync(stream)) {
        if (batch.kind !== 'mlp' && o.inputWidth === null) throw new ConfigError('the exported model is an mlp (input x) and the data gives token batches: its input width must be known; give the config of the job it was trained by');
        const mlp = batch.kind === 'mlp' ? batch : hashedBagOfIds(batch, o.inputWidth!);
        const out = (await session.run({ x: new ort.Tensor('float32', mlp.features, [mlp.size, mlp.featureDim]) }))['predictions']!;
        const classes = Number(out.dims[1]);
        tally ??= new MulticlassTally(classes);
        tally.add(mlp.labels, out.data as Float32Array, mlp.size);
        n += mlp.size;
        o.onBatch?.(n);
      }
      if (tally === null) throw new ConfigError('the test split is empty: nothing to evaluate');
      return tally.result();
    }
    throw new ConfigError(`the ONNX model takes ${session.inputNames.join(', ')}; hetps eval scores models written by hetps export (inputs ids and bag_counts, or x)`);
  } finally {
    await session.release();
  }
}
