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
import { ctrModel, mlpModel, type CtrModel, type MlpModel, type ModelGraph, type TableRows } from '../../native-bridge/mod.ts';
import type { ShardSnapshot } from '../shard/shard.messages.ts';
import { EMB_TABLE, WIDE_TABLE } from '../node/config-bridge.ts';
import { CheckpointError, readCheckpointState, type CheckpointManifest, type CheckpointModel } from './checkpoint.ts';

/** protobuf messages cannot exceed 2 GiB; ONNX external data would lift that, hetps does not write it yet. */
const PROTOBUF_LIMIT = 2 ** 31 - 1;

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

/** Every dense parameter of `model`, put back together from the shards' blocks; throws naming a parameter some of whose values no block holds. */
function denseParams(path: string, model: CtrModel | MlpModel, snaps: Iterable<ShardSnapshot>): Map<string, Float32Array> {
  const out = new Map(model.denseParams.map((p) => [p.name, new Float32Array(p.dims.reduce((a, b) => a * b, 1))]));
  const covered = new Map(model.denseParams.map((p) => [p.name, 0]));
  for (const snap of snaps) {
    for (const b of snap.dense) {
      const v = out.get(b.param);
      if (v === undefined) throw new CheckpointError(`checkpoint ${path}: shard ${snap.shard} holds dense parameter ${b.param}, which the model does not have; the manifest's model and the shards disagree`, path, []);
      if (b.offset + b.length > v.length || b.values.length !== b.length) {
        throw new CheckpointError(`checkpoint ${path}: shard ${snap.shard}'s block ${b.id} of ${b.param} (offset ${b.offset}, ${b.length} values) does not fit its ${v.length} values`, path, []);
      }
      v.set(b.values, b.offset);
      covered.set(b.param, covered.get(b.param)! + b.length);
    }
  }
  for (const [name, v] of out) {
    if (covered.get(name) !== v.length) throw new CheckpointError(`checkpoint ${path}: the shards hold ${covered.get(name)} of the ${v.length} values of dense parameter ${name}; a shard file is missing`, path, []);
  }
  return out;
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
export async function exportCheckpoint(path: string, fallback: CheckpointModel | null = null): Promise<ExportedModel> {
  const { manifest, snapshots } = await readCheckpointState(path);
  const described = manifest.model ?? fallback;
  if (described === null) throw new ConfigError(`checkpoint ${path} does not record its model (written by an older hetps); give the job's config with --config`);
  const model = modelOfCheckpoint(described);
  const snaps = [...snapshots.values()];
  const dense = denseParams(path, model, snaps);
  const metadata: Record<string, string> = {
    'hetps.job': manifest.job, 'hetps.checkpoint': manifest.name, 'hetps.created_at': manifest.created_at, 'hetps.model': JSON.stringify(described),
  };
  let graph: ModelGraph;
  const rows: Record<string, number> = {};
  if (described.type === 'ctr') {
    const emb = tableRows(snaps, EMB_TABLE, described.embedding_dim);
    const wide = described.wide ? tableRows(snaps, WIDE_TABLE, 1) : null;
    rows[EMB_TABLE] = emb.ids.length;
    if (wide !== null) rows[WIDE_TABLE] = wide.ids.length;
    const bytes = emb.values.byteLength + (emb.ids.length + (wide?.ids.length ?? 0)) * 24;
    if (bytes > PROTOBUF_LIMIT) {
      throw new ConfigError(`checkpoint ${path} holds ${emb.ids.length} embedding rows (${(bytes / 2 ** 30).toFixed(1)} GiB), more than one ONNX file can hold (2 GiB, a protobuf limit); hetps does not write ONNX external data yet`);
    }
    graph = (model as CtrModel).exportGraph({ dense, emb, wide, hashBuckets: described.hash_buckets, metadata });
  } else {
    graph = (model as MlpModel).exportGraph({ dense, metadata });
  }
  return { graph, manifest, model: described, rows };
}
