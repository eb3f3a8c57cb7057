/**
 * Every type that crosses into ONNX Runtime is declared here, so the native
 * boundary can be read in one place. Absence is explicit: `T | null`, never an
 * optional property.
 */

/** Element types that hetps feeds to or reads from a session. */
export type TensorDType = 'float32' | 'int32' | 'int64';

/** The JS array that carries each element type. */
export interface TensorDataOf {
  float32: Float32Array;
  int32: Int32Array;
  int64: BigInt64Array;
}
export type TensorData = TensorDataOf[TensorDType];

/**
 * One dimension of a graph input or output: a fixed size, or a symbolic name
 * (`'batch'`, `'unique_rows'`, ...) that every tensor of one run must agree on.
 */
export type Dim = number | string;

/** Name, element type and shape of a graph input or output. */
export interface TensorSpec {
  readonly name: string;
  readonly dtype: TensorDType;
  readonly dims: readonly Dim[];
  /** One line on what the tensor holds; null where the name says it all. */
  readonly doc: string | null;
}

/** A concrete host tensor: row-major data and its shape. */
export interface HostTensor<D extends TensorDType = TensorDType> {
  readonly dtype: D;
  readonly dims: readonly number[];
  readonly data: TensorDataOf[D];
}

/** Inputs of one run, by graph input name. */
export type StepFeeds = Readonly<Record<string, HostTensor>>;

/**
 * Execution providers hetps asks for. `cuda` needs an onnxruntime-node build
 * that ships the CUDA provider library; the default npm build does not.
 */
export type ExecutionProvider = 'cpu' | 'cuda';

/** Which graph of a model a session runs. */
export type GraphKind =
  /** forward + loss + backward: loss, predictions and every gradient. */
  | 'step'
  /** forward only: predictions, no labels needed. */
  | 'eval';

/** Resolved options of one session. */
export interface SessionOptions {
  readonly provider: ExecutionProvider;
  readonly graph: GraphKind;
  /** Threads for one operator; null = number of CPUs. */
  readonly intraOpNumThreads: number | null;
  /** ORT graph optimisation level; `all` unless debugging a graph. */
  readonly graphOptimizationLevel: 'disabled' | 'basic' | 'extended' | 'all';
}

/** A serialized ONNX graph plus the specs of its inputs and outputs. */
export interface ModelGraph {
  /** Model family, e.g. `mlp` or `ctr`. */
  readonly model: string;
  readonly kind: GraphKind;
  readonly inputs: readonly TensorSpec[];
  readonly outputs: readonly TensorSpec[];
  /** ModelProto bytes, ready for `InferenceSession.create(bytes)` (with external data: from a file, next to it). */
  readonly bytes: Uint8Array;
  /** Initializers kept out of `bytes` (ONNX external data), to be written to `location` next to the model file; absent: none. */
  readonly external?: ExternalData | null;
}

/**
 * ONNX external data: initializers of at least `minBytes` are written to a
 * file of their own (`location`, relative to the model file) instead of into
 * the model, which a protobuf message limits to 2 GiB.
 */
export interface ExternalDataOptions {
  location: string;
  minBytes: number;
}

/** The external data file's content: `chunks` written in order (offsets 4 KiB-aligned), `bytes` in all. */
export interface ExternalData {
  location: string;
  chunks: Uint8Array[];
  bytes: number;
}


/** A dense parameter of a model: fixed shape, float32. */
export interface DenseParamSpec {
  readonly name: string;
  readonly dims: readonly number[];
  /** Name of its gradient output in the step graph. */
  readonly gradName: string;
}

/** Result of the matmul throughput probe. */
export interface MatmulProbeResult {
  readonly provider: ExecutionProvider;
  /** Square matrix size n of the n×n · n×n product. */
  readonly size: number;
  readonly iterations: number;
  readonly seconds: number;
  readonly gflops: number;
}

export function f32(data: Float32Array, dims: readonly number[]): HostTensor<'float32'> {
  return { dtype: 'float32', dims, data };
}
export function i32(data: Int32Array, dims: readonly number[]): HostTensor<'int32'> {
  return { dtype: 'int32', dims, data };
}
export function i64(data: BigInt64Array, dims: readonly number[]): HostTensor<'int64'> {
  return { dtype: 'int64', dims, data };
}
