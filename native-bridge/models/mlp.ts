/**
 * `mlp`: dense classifier in → hidden… → classes, ReLU between layers,
 * softmax cross-entropy averaged over the batch.
 */
import { ConfigError, InvalidTensorError } from '../../runtime/errors.ts';
import type { DenseParamSpec, ExternalDataOptions, GraphKind, ModelGraph, StepFeeds } from '../native.ts';
import { GraphBuilder } from '../onnx-builder.ts';
import type { Model } from './model.ts';
import { denseParam, exportedParam, inverseDimOf, towerBackward, towerForward, type TowerLayer } from './tower.ts';

export interface MlpConfig {
  /** Layer widths, input first, classes last: `[1024, 512, 256, 10]`. */
  readonly layers: readonly number[];
}

export const DEFAULT_MLP_CONFIG: MlpConfig = { layers: [1024, 512, 256, 10] };

export const MLP_BATCH = 'batch';

export class MlpModel implements Model {
  readonly family = 'mlp';
  readonly config: MlpConfig;
  readonly denseParams: readonly DenseParamSpec[];
  private readonly graphs = new Map<GraphKind, ModelGraph>();

  constructor(config: MlpConfig) {
    const { layers } = config;
    if (!Array.isArray(layers) || layers.length < 2) throw new ConfigError(`mlp.layers must list at least input and output widths, got ${JSON.stringify(layers)}`);
    for (const w of layers) if (!Number.isInteger(w) || w < 1) throw new ConfigError(`mlp.layers: width ${w} is not a positive integer`);
    if (layers[layers.length - 1]! < 2) throw new ConfigError('mlp.layers: softmax needs at least 2 classes');
    this.config = { layers: [...layers] };
    const params: DenseParamSpec[] = [];
    for (let i = 1; i < layers.length; i++) {
      params.push(denseParam(`W${i}`, [layers[i - 1]!, layers[i]!]));
      params.push(denseParam(`b${i}`, [layers[i]!]));
    }
    this.denseParams = params;
  }

  get inputWidth(): number { return this.config.layers[0]!; }
  get classes(): number { return this.config.layers[this.config.layers.length - 1]!; }

  /**
   * Multiply-add FLOPs per sample the step graph executes: forward 2·Σ in·out,
   * weight gradients 2·Σ in·out, input gradients 2·Σ in·out for every layer but
   * the first (nobody needs dL/dx). Elementwise work is not counted.
   */
  stepFlopsPerSample(): number {
    const { layers } = this.config;
    let fwd = 0; let dInput = 0;
    for (let i = 1; i < layers.length; i++) {
      const mac = layers[i - 1]! * layers[i]!;
      fwd += mac;
      if (i > 1) dInput += mac;
    }
    return 2 * (2 * fwd + dInput);
  }

  graph(kind: GraphKind): ModelGraph {
    let g = this.graphs.get(kind);
    if (g === undefined) { g = this.build(kind); this.graphs.set(kind, g); }
    return g;
  }

  checkFeeds(feeds: StepFeeds, kind: GraphKind): void {
    if (kind !== 'step') return;
    const labels = feeds['labels'];
    if (labels === undefined || labels.dtype !== 'int32') return; // shape check reports it
    const c = this.classes;
    const data = labels.data as Int32Array;
    for (let i = 0; i < data.length; i++) {
      const y = data[i]!;
      if (y < 0 || y >= c) throw new InvalidTensorError(`mlp input labels: labels[${i}] = ${y} is outside [0, ${c})`, { data: { input: 'labels', index: i, value: y } });
    }
  }

  /** The tower's layers, each parameter read through `param` (a graph input, or an initializer in an export). */
  private layers(param: (p: DenseParamSpec) => string): TowerLayer[] {
    const layers: TowerLayer[] = [];
    for (let i = 0; i < this.denseParams.length; i += 2) {
      layers.push({ weight: param(this.denseParams[i]!), bias: param(this.denseParams[i + 1]!) });
    }
    return layers;
  }

  /**
   * A self-contained inference graph: the trained parameters are
   * initializers. Input `x` float32 [B, in] (the same features the trainer
   * reads: for a token source, `hashedBagOfIds`); output `predictions`
   * float32 [B, classes].
   */
  exportGraph(w: { readonly dense: ReadonlyMap<string, Float32Array>; readonly metadata?: Readonly<Record<string, string>>; readonly externalData?: ExternalDataOptions | null }): ModelGraph {
    const g = new GraphBuilder('hetps_mlp_inference', w.externalData ?? null);
    const x = g.input('x', 'float32', [MLP_BATCH, this.inputWidth], 'input features');
    const layers = this.layers((p) => g.initializer(p.name, 'float32', p.dims, exportedParam(w.dense, p)));
    g.op('Softmax', [towerForward(g, x, layers).out], { axis: 1 }, 'predictions');
    g.output('predictions', 'float32', [MLP_BATCH, this.classes], 'class probabilities');
    for (const [k, v] of Object.entries(w.metadata ?? {})) g.meta(k, v);
    return { model: this.family, kind: 'eval', inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize(), external: g.externalData };
  }

  private build(kind: GraphKind): ModelGraph {
    const g = new GraphBuilder(`hetps_mlp_${kind}`);
    const B = MLP_BATCH;
    const C = this.classes;
    const x = g.input('x', 'float32', [B, this.inputWidth], 'input features');
    const labels = kind === 'step' ? g.input('labels', 'int32', [B], 'class index per sample, in [0, classes)') : null;
    const layers = this.layers((p) => g.input(p.name, 'float32', p.dims));
    const fwd = towerForward(g, x, layers);
    if (labels === null) {
      g.op('Softmax', [fwd.out], { axis: 1 }, 'predictions');
      g.output('predictions', 'float32', [B, C], 'class probabilities');
    } else {
      const logp = g.op('LogSoftmax', [fwd.out], { axis: 1 });
      const probs = g.op('Exp', [logp], {}, 'predictions');
      // One-hot by comparing labels [B,1] with 0..C-1 [1,C]: no OneHot kernel type combination to worry about.
      const classIds = g.initializer('class_ids', 'int32', [1, C], Int32Array.from({ length: C }, (_, i) => i));
      const hit = g.op('Equal', [g.op('Unsqueeze', [labels, g.constI64([1])]), classIds]);
      const onehot = g.op('Cast', [hit], { to: 1 });
      const picked = g.op('ReduceSum', [g.op('Mul', [onehot, logp]), g.constI64([1])], { keepdims: 0 });
      g.op('Neg', [g.op('ReduceMean', [picked], { keepdims: 0 })], {}, 'loss');
      // d(mean CE)/dlogits = (softmax − onehot) / B
      const dLogits = g.op('Mul', [g.op('Sub', [probs, onehot]), inverseDimOf(g, x, 0)]);
      towerBackward(g, fwd, layers, dLogits, layers.map((_, i) => ({ weight: `W${i + 1}_grad`, bias: `b${i + 1}_grad` })));
      g.output('loss', 'float32', [], 'mean softmax cross-entropy over the batch');
      g.output('predictions', 'float32', [B, C], 'class probabilities');
      for (const p of this.denseParams) g.output(p.gradName, 'float32', p.dims, `dloss/d${p.name}`);
    }
    return { model: this.family, kind, inputs: g.inputSpecs, outputs: g.outputSpecs, bytes: g.serialize() };
  }
}

/** An mlp sized from a plain config; missing fields take `DEFAULT_MLP_CONFIG`. */
export function mlpModel(config: Partial<MlpConfig> = {}): MlpModel {
  return new MlpModel({ ...DEFAULT_MLP_CONFIG, ...config });
}
