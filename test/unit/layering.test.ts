/**
 * The layers import one way (ARCHITECTURE.md): runtime ← topology,
 * native-bridge ← actors ← deploy ← cli. Read from the sources' import
 * lines, so a new file that reaches the wrong way fails here.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { ROOT } from '../support/ps.ts';

const MAY_IMPORT: Record<string, readonly string[]> = {
  runtime: [],
  topology: ['runtime'],
  'native-bridge': ['runtime'],
  actors: ['runtime', 'topology', 'native-bridge'],
  deploy: ['runtime', 'topology', 'native-bridge', 'actors'],
  cli: ['runtime', 'topology', 'native-bridge', 'actors', 'deploy'],
};

function sources(dir: string): string[] {
  return readdirSync(dir).flatMap((n) => {
    const p = join(dir, n);
    return statSync(p).isDirectory() ? sources(p) : /\.(ts|mjs)$/.test(n) ? [p] : [];
  });
}

test('layers import one way: runtime ← topology, native-bridge ← actors ← deploy ← cli', () => {
  const wrong: string[] = [];
  let checked = 0;
  for (const layer of Object.keys(MAY_IMPORT)) {
    for (const file of sources(join(ROOT, layer))) {
      const text = readFileSync(file, 'utf8');
      for (const m of text.matchAll(/(?:from|import)\s*\(?\s*'(\.{1,2}\/[^']+)'/g)) {
        const target = relative(ROOT, resolve(dirname(file), m[1]!)).split('/')[0]!;
        checked++;
        if (target !== layer && !MAY_IMPORT[layer]!.includes(target)) wrong.push(`${relative(ROOT, file)} imports ${m[1]} (${layer} → ${target})`);
      }
    }
  }
  assert.ok(checked > 200, `read ${checked} imports`);
  assert.deepEqual(wrong, []);
});
