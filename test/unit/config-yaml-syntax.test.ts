/**
 * A YAML syntax error is reported once: the parser's first error, its line
 * and column, and a code frame; not the cascade of errors one mistake
 * causes after it, and no schema problems of a file that did not parse.
 */
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import type { ConfigIssue } from '../../topology/mod.ts';
import { lineOf, rejectedConfig } from '../support/config.ts';

const FILE = 'job.yaml';
const QUICKSTART = readFileSync('examples/quickstart.yaml', 'utf8');



/** The issue's message has a code frame: source lines, then a caret under the column. */
function assertCodeFrame(issue: ConfigIssue, sourceLine: string): void {
  const lines = issue.message.split('\n');
  const at = lines.findIndex((l) => l.endsWith(sourceLine));
  assert.ok(at > 0, `the frame shows ${JSON.stringify(sourceLine)}:\n${issue.message}`);
  const caret = lines.at(-1)!;
  assert.match(caret, /^ *\^+$/, `the frame ends with a caret line:\n${issue.message}`);
  const frameIndent = lines[at]!.length - sourceLine.length;
  assert.equal(caret.indexOf('^') - frameIndent + 1, issue.column, `the caret is under column ${issue.column}:\n${issue.message}`);
}

describe('YAML syntax errors', () => {
  test('an unclosed flow sequence: one problem with its line, column and code frame', () => {
    const text = 'cluster:\n  worker_groups: [a, b\n  server_nodes: [s]\n';
    const { error, issues } = rejectedConfig(text);
    assert.equal(issues.length, 1);
    const [issue] = issues;
    assert.deepEqual([issue!.path, issue!.line, issue!.column], ['', 3, 3]);
    assert.match(issue!.message, /^YAML syntax: Flow sequence in block collection must be sufficiently indented and end with a \]\n/);
    assertCodeFrame(issue!, '  server_nodes: [s]');
    assert.ok(error.message.startsWith(`invalid config ${FILE} (1 problem):\n  ${FILE}:3:3: YAML syntax: `), error.message);
    assert.ok(error.message.includes(issue!.message), 'the ConfigError shows the frame');
  });

  test('`cluster: [` in the quickstart: the first error only, with how many more the parser found', () => {
    const text = QUICKSTART.replace(/^cluster:$/m, 'cluster: [');
    assert.notEqual(text, QUICKSTART);
    const { error, issues } = rejectedConfig(text);
    assert.equal(issues.length, 1, error.message);
    const [issue] = issues;
    assert.ok(issue!.line !== null && issue!.line > lineOf(text, 'cluster: ['), `a line after the bracket: ${issue!.line}`);
    assert.match(issue!.message, /^YAML syntax: .+ \(and \d+ more parse errors after it\)\n/);
    assert.match(error.message, new RegExp(`^invalid config ${FILE} \\(1 problem\\):\\n  ${FILE}:${issue!.line}:${issue!.column}: YAML syntax: `));
    assertCodeFrame(issue!, text.split('\n')[issue!.line! - 1]!);
  });

  test('a bad indentation in the quickstart is reported at that line', () => {
    const text = QUICKSTART.replace('      nodes: [fast-1', '     nodes: [fast-1');
    assert.notEqual(text, QUICKSTART);
    const { issues } = rejectedConfig(text);
    assert.equal(issues.length, 1);
    assert.equal(issues[0]!.line, lineOf(text, '     nodes: [fast-1'));
    assertCodeFrame(issues[0]!, '     nodes: [fast-1, fast-2, fast-3]');
  });

  test('a file that does not parse gets no schema problems', () => {
    const text = 'cluster:\n  worker_grups: []\n  server_nodes: [s\nmodel: { type: nope }\n';
    const { issues } = rejectedConfig(text);
    assert.equal(issues.length, 1);
    assert.match(issues[0]!.message, /^YAML syntax: /);
  });

  test('a single error does not mention more', () => {
    const { issues } = rejectedConfig('a: 1\nb: 2\na: 3\n');
    assert.equal(issues.length, 1);
    assert.doesNotMatch(issues[0]!.message, /more parse error/);
    assert.equal(issues[0]!.line, 3);
  });
});
