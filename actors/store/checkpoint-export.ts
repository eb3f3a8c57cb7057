/**
 * `hetps export`: a checkpoint turned into a self-contained ONNX inference
 * graph. The shards' state is read as a resume reads it (the checkpoint and
 * its chain verified, deltas applied); the dense blocks are put back
 * together into the model's parameters and the sparse rows of every shard
 * into one table per name; the model (recorded in the manifest, or given by
 * a config for older checkpoints) builds the graph with them as
 * initializers: `CtrModel.exportGraph` / `MlpModel.exportGraph`.
 */
import { ConfigError } from '../../runtime/errors.ts';
import { ctrModel, mlpModel, type CtrModel, type ExternalDataOptions, type MlpModel, type ModelGraph, type TableRows, idLookupBytes } from '../../native-bridge/mod.ts';
import type { ShardSnapshot } from '../shard/shard.messages.ts';
import { EMB_TABLE, WIDE_TABLE } from '../node/config-bridge.ts';
import { CheckpointError, readCheckpointState, type CheckpointManifest, type CheckpointModel } from './checkpoint.ts';
import { wholeDense } from './checkpoint-reshard.ts';

/** protobuf messages cannot exceed 2 GiB: a model estimated above this keeps its large initializers in an external data file. */
const PROTOBUF_LIMIT = 2 ** 31 - 1;
const ROOM = 64 * 2 ** 20;
/** Initializers of at least this size go to the external data file when the model would not fit in one file. */
const AUTO_EXTERNAL_MIN_BYTES = 2 ** 20;

export interface ExportOptions {
  /** The external data file's name (next to the model file), e.g. `model.onnx.data`. */
  externalLocation: string;
  /** Initializers of at least this many bytes go to it; null: only when the model would not fit in one file (2 GiB). */
  externalAbove: number | null;
}

export interface ExportedModel {
  graph: ModelGraph;
  manifest: CheckpointManifest;
  model: CheckpointModel;
  /** Rows baked in per sparse table. */
  rows: Record<string, number>;
}

/** The model a checkpoint describes as a native-bridge model. */
export function modelOfCheckpoint(m: CheckpointModel): CtrModel | MlpModel {
  if (m.type === 'mlp') return mlpModel({ layers: m.layers });
  return ctrModel({ slots: m.slots, embeddingDim: m.embedding_dim, denseFeatures: m.dense_features, hidden: m.hidden, pooling: m.pooling });
}

/** One sparse table's rows from every shard, concatenated (each row lives on one shard). */
function tableRows(snaps: readonly ShardSnapshot[], table: string, dim: number): TableRows {
  const parts = snaps.flatMap((s) => s.sparse.filter((t) => t.table === table));
  for (const p of parts) if (p.dim !== dim) throw new CheckpointError(`table ${table} has rows of ${p.dim} values, the model ${dim}`, '', []);
  const n = parts.reduce((a, p) => a + p.ids.length, 0);
  const ids = new Uint32Array(n);
  const values = new Float32Array(n * dim);
  let at = 0;
  for (const p of parts) {
    ids.set(p.ids, at);
    values.set(p.values.subarray(0, p.ids.length * dim), at * dim);
    at += p.ids.length;
  }
  return { ids, values };
}

/**
 * Reads the checkpoint at `path` (and its chain) and builds the inference
 * graph. `fallback`: the model to use when the manifest records none
 * (a checkpoint written before hetps recorded it).
 */
export async function exportCheckpoint(path: string, fallback: CheckpointModel | null = null, o: ExportOptions | null = null): Promise<ExportedModel> {
  const { manifest, snapshots } = await readCheckpointState(path);
  const described = manifest.model ?? fallback;
  if (described === null) throw new ConfigError(`checkpoint ${path} does not record its model (written by an older hetps); give the job's config with --config`);
  const model = modelOfCheckpoint(described);
  const snaps = [...snapshots.values()];
  const fail = (what: string): never => { throw new CheckpointError(`checkpoint ${path}: ${what}`, path, []); };
  const whole = wholeDense(snaps, model.denseParams.map((p) => ({ name: p.name, size: p.dims.reduce((a, b) => a * b, 1) })), fail);
  const dense = new Map([...whole].map(([name, w]) => [name, w.values]));
  const metadata: Record<string, string> = {
    'hetps.job': manifest.job, 'hetps.checkpoint': manifest.name, 'hetps.created_at': manifest.created_at, 'hetps.model': JSON.stringify(described),
  };
  let graph: ModelGraph;
  const rows: Record<string, number> = {};
  const denseBytes = [...dense.values()].reduce((a, v) => a + v.byteLength, 0);
  /** External data as asked, or where the model would not fit in one protobuf message. */
  const externalFor = (bytes: number): ExternalDataOptions | null => {
    if (o?.externalAbove != null) return { location: o.externalLocation, minBytes: o.externalAbove };
    if (bytes <= PROTOBUF_LIMIT - ROOM) return null;
    if (o === null) throw new ConfigError(`checkpoint ${path}: the model is ${(bytes / 2 ** 30).toFixed(1)} GiB, more than one ONNX file holds (2 GiB); export it with an external data file (hetps export does so by itself)`);
    return { location: o.externalLocation, minBytes: AUTO_EXTERNAL_MIN_BYTES };
  };
  if (described.type === 'ctr') {
    const emb = tableRows(snaps, EMB_TABLE, described.embedding_dim);
    const wide = described.wide ? tableRows(snaps, WIDE_TABLE, 1) : null;
    rows[EMB_TABLE] = emb.ids.length;
    if (wide !== null) rows[WIDE_TABLE] = wide.ids.length;
    // The embedding and wide tables (with their zero row), and the id → row lookup: a row-of-bucket table (int32 a bucket)
    // or the LabelEncoder's keys and values (int64 each; ctr.ts says which, and refuses a raw-id map too large for the model file).
    const seenIds = Math.max(emb.ids.length, wide?.ids.length ?? 0);
    const bytes = denseBytes + emb.values.byteLength + (wide?.values.byteLength ?? 0) + idLookupBytes(described.hash_buckets, described.slots, seenIds);
    graph = (model as CtrModel).exportGraph({ dense, emb, wide, hashBuckets: described.hash_buckets, metadata, externalData: externalFor(bytes) });
  } else {
    graph = (model as MlpModel).exportGraph({ dense, metadata, externalData: externalFor(denseBytes) });
  }
  return { graph, manifest, model: described, rows };
}
