/**
 * CPU time of the processes of a run, for the summary's `cpu` section: how
 * much of the machine the job itself used while training ran. Child
 * processes (node processes, nats-servers) are read from /proc/<pid>/stat
 * (utime + stime, which include every thread, onnxruntime's too) while they
 * are alive, this process from `process.cpuUsage()`. The whole machine's
 * busy share over the same window comes from /proc/stat, so load from
 * outside the job (other runs on a shared machine) shows as the difference.
 * Without /proc (not Linux) the child figures are null.
 */
import { readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { performance } from 'node:perf_hooks';

/** USER_HZ: /proc reports CPU time in ticks of 1/100 s on every Linux architecture Node runs on. */
const TICKS_PER_S = 100;

/** utime + stime of `pid` in seconds; null when the process is gone or /proc is not there. */
export function processCpuSeconds(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name (field 2) may hold spaces and parentheses: count fields after its closing one.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const utime = Number(rest[11]);
    const stime = Number(rest[12]);
    return Number.isFinite(utime) && Number.isFinite(stime) ? (utime + stime) / TICKS_PER_S : null;
  } catch {
    return null;
  }
}

/** Busy and total jiffies of the whole machine (all CPUs), from the first line of /proc/stat. */
function machineJiffies(): { busy: number; total: number } | null {
  try {
    const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!;
    const v = line.trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal (guest time is already inside user)
    const total = v.slice(0, 8).reduce((a, b) => a + b, 0);
    const idle = (v[3] ?? 0) + (v[4] ?? 0);
    return { busy: total - idle, total };
  } catch {
    return null;
  }
}

export interface CpuProcess {
  name: string;
  /** null: this process. */
  pid: number | null;
}

export interface CpuSnapshot {
  atMs: number;
  seconds: Map<string, number | null>;
  machine: { busy: number; total: number } | null;
}

export function cpuSnapshot(processes: readonly CpuProcess[]): CpuSnapshot {
  const seconds = new Map<string, number | null>();
  for (const p of processes) {
    if (p.pid === null) { const u = process.cpuUsage(); seconds.set(p.name, (u.user + u.system) / 1e6); }
    else seconds.set(p.name, processCpuSeconds(p.pid));
  }
  return { atMs: performance.now(), seconds, machine: machineJiffies() };
}

export interface CpuReport {
  /** Seconds between the two snapshots (the training window as the driver saw it). */
  window_s: number;
  cores: number;
  /** CPU seconds of the job's processes in the window: nodes, nats-servers, the driver. */
  process_cpu_s: number;
  /** process_cpu_s / (window_s × cores): the share of the machine the job used. */
  cpu_busy_fraction: number;
  /** The whole machine's busy share over the window (the job and everything else); null without /proc/stat. */
  machine_busy_fraction: number | null;
  /** CPU seconds per process in the window; null where a process could not be read. */
  per_process: Record<string, number | null>;
}

export function cpuBetween(a: CpuSnapshot, b: CpuSnapshot, cores = availableParallelism()): CpuReport {
  const windowS = Math.max(1e-9, (b.atMs - a.atMs) / 1000);
  const perProcess: Record<string, number | null> = {};
  let sum = 0;
  for (const [name, end] of b.seconds) {
    const begin = a.seconds.get(name);
    const d = end !== null && begin !== undefined && begin !== null ? Math.max(0, end - begin) : null;
    perProcess[name] = d;
    sum += d ?? 0;
  }
  const machine = a.machine && b.machine && b.machine.total > a.machine.total
    ? (b.machine.busy - a.machine.busy) / (b.machine.total - a.machine.total) : null;
  return { window_s: windowS, cores, process_cpu_s: sum, cpu_busy_fraction: sum / (windowS * cores), machine_busy_fraction: machine, per_process: perProcess };
}
