/** Public entry of native-bridge: what actors, cli and bench import. */
export type {
  TensorDType, TensorDataOf, TensorData, Dim, TensorSpec, HostTensor, StepFeeds, ExecutionProvider,
  GraphKind, SessionOptions, ModelGraph, DenseParamSpec, MatmulProbeResult, ExternalData, ExternalDataOptions,
} from './native.ts';
export { f32, i32, i64 } from './native.ts';
export { GraphBuilder, OPSET } from './onnx-builder.ts';
export * from './models/index.ts';
export { StepSession, StepOutputs, DEFAULT_SESSION_OPTIONS, checkFeedShapes, providerListed } from './session.ts';
export { measureMatmulGflops, matmulGraph, measureGatherRowsPerSecond, gatherGraph, timeRuns } from './probe.ts';
export { profileDevice, coefficientOfVariation, type DeviceProfile, type ProfileOptions } from './profile.ts';
export * from './optimizers.ts';
export * from './fp16.ts';
export * from './metrics.ts';
export * from './data/batch.ts';
export * from './data/spam.ts';
export * from './data/ctr-synthetic.ts';
export * from './data/mlp-synthetic.ts';
export { ROW_CHUNK, SparseTable, type ApplyOptions, type SparseTableOptions, type SparseTableSnapshot } from './sparse-table.ts';
export { IdIndex } from './id-index.ts';
export * from './local-trainer.ts';
export { evaluateExported, exportedCtrFeeds, onnxMetadata } from './exported.ts';
