/** Public entry of native-bridge: what actors, cli and bench import. */
export type {
  TensorDType, TensorDataOf, TensorData, Dim, TensorSpec, HostTensor, StepFeeds, ExecutionProvider,
  GraphKind, SessionOptions, ModelGraph, DenseParamSpec, MatmulProbeResult,
} from './native.ts';
export { f32, i32, i64 } from './native.ts';
export { GraphBuilder, OPSET } from './onnx-builder.ts';
export * from './models/index.ts';
export { StepSession, StepOutputs, DEFAULT_SESSION_OPTIONS, checkFeedShapes, providerListed } from './session.ts';
export { measureMatmulGflops, matmulGraph } from './probe.ts';
