/**
 * A CPU quota for a test's process, through a Linux cgroup (v1's `cpu`
 * controller, or v2's `cpu.max`): the process gets at most `cores` of CPU
 * time however much it asks for, as on a slower or shared machine. Needs
 * root; where no cgroup can be made the call fails naming why (a test does
 * not skip).
 */
import { access, mkdir, readFile, rmdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

const V1 = '/sys/fs/cgroup/cpu';
const V2 = '/sys/fs/cgroup';
const PERIOD_US = 100_000;

export interface CpuThrottle {
  /** The cgroup's directory. */
  readonly path: string;
  /** Puts process `pid` (every thread of it) under the quota. */
  add(pid: number): Promise<void>;
  /** Moves its processes back to the root group and removes the group. */
  close(): Promise<void>;
}

const exists = (p: string) => access(p).then(() => true, () => false);

export async function cpuThrottle(name: string, cores: number): Promise<CpuThrottle> {
  if (!(cores > 0)) throw new RangeError(`cpuThrottle: cores must be > 0, got ${cores}`);
  const quota = String(Math.max(1_000, Math.round(cores * PERIOD_US)));
  let root: string;
  let path: string;
  if (await exists(join(V1, 'cpu.cfs_quota_us'))) {
    root = V1;
    path = join(V1, name);
    await mkdir(path, { recursive: true });
    await writeFile(join(path, 'cpu.cfs_period_us'), String(PERIOD_US));
    await writeFile(join(path, 'cpu.cfs_quota_us'), quota);
  } else if ((await readFile(join(V2, 'cgroup.controllers'), 'utf8').catch(() => '')).split(/\s+/).includes('cpu')) {
    root = V2;
    path = join(V2, name);
    await writeFile(join(V2, 'cgroup.subtree_control'), '+cpu').catch(() => undefined);
    await mkdir(path, { recursive: true });
    await writeFile(join(path, 'cpu.max'), `${quota} ${PERIOD_US}`);
  } else {
    throw new Error(`cpuThrottle: no cgroup cpu controller at ${V1} (v1) or in ${join(V2, 'cgroup.controllers')} (v2); this test needs root on Linux with one`);
  }
  return {
    path,
    async add(pid: number) { await writeFile(join(path, 'cgroup.procs'), String(pid)); },
    async close() {
      const pids = (await readFile(join(path, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter(Boolean);
      for (const pid of pids) await writeFile(join(root, 'cgroup.procs'), pid).catch(() => undefined);
      await rmdir(path).catch(() => undefined);
    },
  };
}
