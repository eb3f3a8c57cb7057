#!/usr/bin/env node
// Runs every test/**/*.test.ts file with node's test runner through tsx.
// Usage: node scripts/run-tests.mjs [unit|integration|chaos|...] (default: all)
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';

function find(dir) {
  const out = [];
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    if (statSync(p).isDirectory()) out.push(...find(p));
    else if (name.endsWith('.test.ts')) out.push(p);
  }
  return out;
}
const dirs = process.argv.slice(2);
const roots = dirs.length ? dirs.map((d) => join('test', d)) : ['test'];
const files = roots.flatMap(find).sort();
if (files.length === 0) {
  console.error(`no test files under ${roots.join(', ')}`);
  process.exit(1);
}
// Integration tests start real nats-server clusters; running files one at a
// time keeps a 2-core machine from timing them out.
const r = spawnSync(process.execPath, ['--import', 'tsx', '--test', '--test-concurrency=1', ...files], { stdio: 'inherit' });
process.exit(r.status ?? 1);
