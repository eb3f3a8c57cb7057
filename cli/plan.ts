/** `hetps plan …`: see what the planners would decide, from files, without starting a job. */
import { Option, type Command } from 'commander';
import { readFile } from 'node:fs/promises';
import { ConfigError } from '../runtime/errors.ts';
import { DEFAULT_GROUPING_OPTIONS, groupNodes, parseNodeProfiles, type Grouping } from '../topology/mod.ts';

function integer(flag: string, min: number) {
  return (v: string): number => {
    const n = Number(v);
    if (!/^\s*-?\d+\s*$/.test(v) || !Number.isSafeInteger(n) || n < min) throw new ConfigError(`${flag} must be an integer ≥ ${min}, got ${JSON.stringify(v)}`);
    return n;
  };
}

function kRange(v: string): [number, number] {
  const m = /^\s*(\d+)\s*(?:-|\.\.)\s*(\d+)\s*$/.exec(v);
  const lo = Number(m?.[1]);
  const hi = Number(m?.[2]);
  if (!m || lo < 1 || lo > hi) throw new ConfigError(`--k-range must be LO-HI with 1 ≤ LO ≤ HI, e.g. 3-5; got ${JSON.stringify(v)}`);
  return [lo, hi];
}

async function readProfiles(file: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    throw new ConfigError(`profiles file ${file} ${code === 'ENOENT' ? 'does not exist' : `cannot be read (${(e as Error).message})`}`, { cause: e, data: { file } });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`profiles file ${file} is not valid JSON: ${(e as Error).message}`, { cause: e, data: { file } });
  }
}

function printText(g: Grouping): void {
  const lines = [`${g.k} group${g.k === 1 ? '' : 's'} (${g.criterion}${g.score === null ? '' : `, silhouette ${g.score}`}): ${g.reason}`];
  for (const grp of g.groups) {
    const c = grp.centroid;
    const centre = c ? `  ~${c.matmul_gflops} GFLOP/s, ${c.gather_rows_per_s} rows/s, ${c.bandwidth_mbps} Mbit/s, rtt ${c.rtt_ms} ms` : '';
    lines.push(`  ${grp.name}: ${grp.nodes.join(', ')}${centre}`);
  }
  // Why a k that may have scored higher was passed over.
  for (const c of g.candidates) if (c.refused !== undefined) lines.push(`  not k=${c.k} (silhouette ${c.score}): ${c.refused}`);
  process.stdout.write(`${lines.join('\n')}\n`);
}

export function register(program: Command): void {
  const plan = program.command('plan').description('show what the planners decide, from files, without starting a job');
  plan
    .command('groups')
    .description('group nodes by measured speed (K-means on compute, bandwidth, memory, latency, stability; k by silhouette)')
    .requiredOption('--profiles <file>', 'JSON array of node profiles: the fields of `hetps profile --json` plus bandwidth_mbps and rtt_ms')
    .option('--k <n>', 'fixed number of groups (default: chosen by silhouette within --k-range)', integer('--k', 1))
    .addOption(new Option('--k-range <lo-hi>', 'range searched for k (the low end drops to n/2 for small clusters)')
      .argParser(kRange).default([...DEFAULT_GROUPING_OPTIONS.kRange], DEFAULT_GROUPING_OPTIONS.kRange.join('-')))
    .option('--seed <s>', 'seed for k-means++ (same seed, same groups)', integer('--seed', 0), DEFAULT_GROUPING_OPTIONS.seed)
    .option('--restarts <n>', 'k-means runs per k; the lowest inertia wins', integer('--restarts', 1), DEFAULT_GROUPING_OPTIONS.restarts)
    .option('--json', 'print { k, criterion, score, reason, candidates, groups: [{ name, nodes, centroid }] } on stdout', false)
    .action(async (o: { profiles: string; k?: number; kRange: [number, number]; seed: number; restarts: number; json: boolean }) => {
      const profiles = parseNodeProfiles(await readProfiles(o.profiles), o.profiles);
      const g = groupNodes(profiles, { k: o.k ?? null, kRange: o.kRange, seed: o.seed, restarts: o.restarts });
      const emulated = profiles.filter((p) => p.emulated).map((p) => p.node);
      if (emulated.length) process.stderr.write(`note: emulated hardware in the profiles of ${emulated.join(', ')}\n`);
      if (o.json) {
        const out = { k: g.k, criterion: g.criterion, score: g.score, reason: g.reason, candidates: g.candidates, groups: g.groups };
        process.stdout.write(`${JSON.stringify(out)}\n`);
      } else printText(g);
    });
}
