// fp16 gradient compression throughput: encodes a 4 MiB gradient (1 Mi floats)
// repeatedly and reports MB/s of float32 data (10^6 bytes); writes bench/results/fp16.json.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { measureFp16DecodeMbPerS, measureFp16EncodeMbPerS } from '../native-bridge/fp16.ts';

export { measureFp16EncodeMbPerS };

const floats = 1 << 20;
const encodeMbPerS = measureFp16EncodeMbPerS({ floats, minMillis: 1000 });
const decodeMbPerS = measureFp16DecodeMbPerS({ floats, minMillis: 1000 });
console.log(`fp16 encode: ${encodeMbPerS.toFixed(0)} MB/s (float32 in), decode: ${decodeMbPerS.toFixed(0)} MB/s (float32 out), tensor ${floats} floats`);

const resultsDir = join(dirname(fileURLToPath(import.meta.url)), 'results');
mkdirSync(resultsDir, { recursive: true });
writeFileSync(join(resultsDir, 'fp16.json'), JSON.stringify({
  bench: 'fp16',
  floats,
  encodeMbPerS,
  decodeMbPerS,
  node: process.version,
  at: new Date().toISOString(),
}, null, 2) + '\n');
