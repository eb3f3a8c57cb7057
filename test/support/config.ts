/** What the config tests share: a small valid config, and reading a rejection's issues. */
import assert from 'node:assert/strict';
import { ConfigError } from '../../runtime/errors.ts';
import { parseConfig, type ConfigIssue } from '../../topology/mod.ts';

export const CONFIG_FILE = 'job.yaml';

/** One group of two workers on two servers, ctr on spam: a valid config the examples extend. */
export const SMALL_CLUSTER = `cluster:
  worker_groups:
    - name: g1
      nodes: [w1, w2]
  server_nodes: [s1, s2]
model: { type: ctr }
data: { source: spam }
`;

/** The ConfigError `text` is rejected with, and its issues; fails the test when it is accepted. */
export function rejectedConfig(text: string, file = CONFIG_FILE): { error: ConfigError; issues: ConfigIssue[] } {
  try {
    parseConfig(text, file);
  } catch (e) {
    assert.ok(e instanceof ConfigError, `expected a ConfigError, got ${String(e)}`);
    return { error: e, issues: (e.data as { issues: ConfigIssue[] }).issues };
  }
  assert.fail('expected the config to be rejected');
}

/** The 1-based line of `text` that contains `needle`. */
export function lineOf(text: string, needle: string): number {
  const i = text.split('\n').findIndex((l) => l.includes(needle));
  assert.ok(i >= 0, `${JSON.stringify(needle)} is not in the text`);
  return i + 1;
}
