/**
 * Text → hashed ids: a small RFC 822 / MIME reader and a word tokenizer for
 * e-mail, plus salted hashing of tokens into one global id space.
 *
 * The MIME handling is deliberately modest: it splits multipart bodies, keeps
 * text parts (decoding base64 and quoted-printable, since spam often hides its
 * HTML that way), drops attachments and strips HTML tags. It is a feature
 * extractor, not a mail client.
 */
import { hashString } from '../../runtime/random.ts';
import { fmix32 } from './stream.ts';

export interface ParsedMail {
  /** Lower-cased header name → values in order (continuation lines unfolded). */
  headers: Map<string, string[]>;
  /** Everything after the first blank line, untouched. */
  body: string;
}

const HEADER_LINE = /^([!-9;-~]+):[ \t]?(.*)$/;

function splitHeaderBlock(text: string): { head: string; body: string } {
  const m = /\r?\n\r?\n/.exec(text);
  if (m === null) return { head: text, body: '' };
  return { head: text.slice(0, m.index), body: text.slice(m.index + m[0].length) };
}

function parseHeaderBlock(head: string): Map<string, string[]> {
  const headers = new Map<string, string[]>();
  let name: string | null = null;
  let value = '';
  const flush = () => {
    if (name === null) return;
    const list = headers.get(name);
    if (list) list.push(value.trim()); else headers.set(name, [value.trim()]);
  };
  for (const line of head.split(/\r?\n/)) {
    if ((line.startsWith(' ') || line.startsWith('\t')) && name !== null) {
      value += ' ' + line.trim();
      continue;
    }
    const m = HEADER_LINE.exec(line);
    flush();
    // Lines that are not headers (the mbox "From " separator) are skipped.
    if (m === null) { name = null; continue; }
    name = m[1]!.toLowerCase();
    value = m[2]!;
  }
  flush();
  return headers;
}

/** Splits a raw message into unfolded headers and body. */
export function parseMail(text: string): ParsedMail {
  const { head, body } = splitHeaderBlock(text);
  return { headers: parseHeaderBlock(head), body };
}

/** First value of a header, or null. */
export function headerValue(headers: Map<string, string[]>, name: string): string | null {
  return headers.get(name.toLowerCase())?.[0] ?? null;
}

/** `text/html; charset="x"` → { type: 'text/html', params: { charset: 'x' } } */
export function parseContentType(value: string | null): { type: string; params: Map<string, string> } {
  const params = new Map<string, string>();
  if (value === null) return { type: 'text/plain', params };
  const parts = value.split(';');
  const type = (parts[0] ?? '').trim().toLowerCase() || 'text/plain';
  for (const p of parts.slice(1)) {
    const eq = p.indexOf('=');
    if (eq < 0) continue;
    params.set(p.slice(0, eq).trim().toLowerCase(), p.slice(eq + 1).trim().replace(/^"(.*)"$/, '$1'));
  }
  return { type, params };
}

/** The domain of the first address in a From-like header, lower-cased, or null. */
export function emailDomain(value: string | null): string | null {
  if (value === null) return null;
  const m = /@([a-z0-9.-]+[a-z0-9])/i.exec(value);
  return m ? m[1]!.toLowerCase() : null;
}

function decodeQuotedPrintable(s: string): string {
  return s.replace(/=\r?\n/g, '').replace(/=([0-9A-Fa-f]{2})/g, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
}

function decodeBase64(s: string): string {
  return Buffer.from(s.replace(/[^A-Za-z0-9+/=]/g, ''), 'base64').toString('latin1');
}

function decodeTransfer(body: string, encoding: string | null): string {
  const e = (encoding ?? '').trim().toLowerCase();
  if (e === 'base64') return decodeBase64(body);
  if (e === 'quoted-printable') return decodeQuotedPrintable(body);
  return body;
}

const HTML_ENTITIES: Record<string, string> = { nbsp: ' ', amp: '&', lt: '<', gt: '>', quot: '"', apos: "'" };

/** Tags and comments to spaces, common entities decoded; script/style contents dropped. */
export function stripHtml(html: string): string {
  return html
    .replace(/<(script|style)\b[\s\S]*?<\/\1\s*>/gi, ' ')
    .replace(/<!--[\s\S]*?-->/g, ' ')
    .replace(/<[^>]*>/g, ' ')
    .replace(/&(#\d+|[a-z]+);/gi, (m, ent: string) => {
      if (ent.startsWith('#')) {
        const code = Number(ent.slice(1));
        return code > 0 && code < 0x110000 ? String.fromCodePoint(code) : ' ';
      }
      return HTML_ENTITIES[ent.toLowerCase()] ?? ' ';
    });
}

export interface MailContent {
  /** Readable text of the body: text parts decoded, HTML stripped. */
  text: string;
  /** Any text/html part or HTML-looking body. */
  hasHtml: boolean;
  /** Content types of parts that were not text (attachments), in order. */
  attachmentTypes: string[];
  /** Host names of http(s) links in the text parts (HTML attributes included), lower-cased, in order. */
  urlHosts: string[];
}

const URL_HOST = /https?:\/\/([a-z0-9.-]+[a-z0-9])/gi;

const MAX_MIME_DEPTH = 4;
const MAX_PART_CHARS = 200_000;

type PartsOut = { texts: string[]; hasHtml: boolean; attachmentTypes: string[]; urlHosts: string[] };

function collectParts(headers: Map<string, string[]>, body: string, depth: number, out: PartsOut): void {
  const { type, params } = parseContentType(headerValue(headers, 'content-type'));
  const boundary = params.get('boundary');
  if (type.startsWith('multipart/') && boundary && depth < MAX_MIME_DEPTH) {
    const delimiter = '--' + boundary;
    const pieces = body.split(delimiter);
    // pieces[0] is the preamble; a piece starting with "--" is the epilogue
    for (let i = 1; i < pieces.length; i++) {
      const piece = pieces[i]!;
      if (piece.startsWith('--')) break;
      const part = parseMail(piece.replace(/^[ \t]*\r?\n/, ''));
      collectParts(part.headers, part.body, depth + 1, out);
    }
    return;
  }
  if (type.startsWith('multipart/')) {
    // no usable boundary: fall back to treating it as text
    out.texts.push(body.slice(0, MAX_PART_CHARS));
    return;
  }
  if (type === 'message/rfc822' && depth < MAX_MIME_DEPTH) {
    const inner = parseMail(body);
    collectParts(inner.headers, inner.body, depth + 1, out);
    return;
  }
  if (!type.startsWith('text/')) {
    out.attachmentTypes.push(type);
    return;
  }
  const decoded = decodeTransfer(body.slice(0, MAX_PART_CHARS), headerValue(headers, 'content-transfer-encoding'));
  const isHtml = type === 'text/html' || /<(html|body|table|font|a\s+href|div|p)\b/i.test(decoded.slice(0, 5000));
  if (isHtml) out.hasHtml = true;
  for (const m of decoded.matchAll(URL_HOST)) out.urlHosts.push(m[1]!.toLowerCase());
  out.texts.push(isHtml ? stripHtml(decoded) : decoded);
}

/** The readable text of a parsed mail's body. */
export function mailContent(mail: ParsedMail): MailContent {
  const out: PartsOut = { texts: [], hasHtml: false, attachmentTypes: [], urlHosts: [] };
  collectParts(mail.headers, mail.body, 0, out);
  return { text: out.texts.join('\n'), hasHtml: out.hasHtml, attachmentTypes: out.attachmentTypes, urlHosts: out.urlHosts };
}

/** Letters and digits (any script), plus `$`; everything else separates words. */
const WORD = /[\p{L}\p{N}$]+/gu;
/** Longer "words" are mostly encoded junk; keep a prefix so they still hash consistently. */
const MAX_WORD_CHARS = 24;

/** Lower-cased word tokens in order, at most `maxTokens` (the rest of the text is not scanned). */
export function wordTokens(text: string, maxTokens: number): string[] {
  const out: string[] = [];
  if (maxTokens <= 0) return out;
  WORD.lastIndex = 0;
  let m: RegExpExecArray | null;
  while ((m = WORD.exec(text)) !== null) {
    const w = m[0].length > MAX_WORD_CHARS ? m[0].slice(0, MAX_WORD_CHARS) : m[0];
    out.push(w.toLowerCase());
    if (out.length >= maxTokens) break;
  }
  return out;
}

/** Adjacent pairs `a b` of a token list. */
export function bigrams(tokens: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i + 1 < tokens.length; i++) out.push(tokens[i]! + ' ' + tokens[i + 1]!);
  return out;
}

/** The hash salt of a slot: tokens of different slots land on unrelated ids. */
export function slotSalt(slotName: string): number {
  return hashString(`slot:${slotName}`);
}

/**
 * FNV-1a of the token under the slot's salt, reduced into `[0, vocabularySize)`.
 * FNV's low bits mix poorly and power-of-two vocabularies keep only low bits,
 * so the hash goes through murmur's finaliser first.
 */
export function hashToken(token: string, salt: number, vocabularySize: number): number {
  return fmix32(hashString(token, salt)) % vocabularySize;
}

/** Hashes a token list into an Int32Array of ids. */
export function hashTokens(tokens: readonly string[], salt: number, vocabularySize: number): Int32Array {
  const ids = new Int32Array(tokens.length);
  for (let i = 0; i < tokens.length; i++) ids[i] = hashToken(tokens[i]!, salt, vocabularySize);
  return ids;
}
