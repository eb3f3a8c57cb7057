export { type Model, initDenseParams } from './model.ts';
export { MlpModel, mlpModel, DEFAULT_MLP_CONFIG, type MlpConfig } from './mlp.ts';
export { CtrModel, ctrModel, ctrBagIndex, DEFAULT_CTR_CONFIG, type CtrConfig, type BagPooling, type CtrBagIndex, type CtrExportWeights, type TableRows, LABEL_ENCODER_BYTES_PER_ROW, useBucketTable, idLookupBytes } from './ctr.ts';
export { syntheticMlpFeeds, syntheticCtrFeeds, type SyntheticCtrShape } from './synthetic.ts';
