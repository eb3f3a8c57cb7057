/**
 * One throw-away nats-server with an arbitrary config block (auth, TLS), on
 * a random port in a temp dir, for tests of connection options that the
 * cluster harness does not cover.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findNatsServer } from '../../deploy/local-cluster.ts';

export interface SingleServer extends AsyncDisposable {
  url: string;
  port: number;
  dir: string;
}

export async function startSingleServer(extraConfig: string, opts: { scheme?: 'nats' | 'tls' } = {}): Promise<SingleServer> {
  const bin = findNatsServer();
  const dir = await mkdtemp(join(tmpdir(), 'hetps-test-single-'));
  const conf = join(dir, 'nats.conf');
  await writeFile(conf, `listen: "127.0.0.1:-1"\nports_file_dir: "${dir}"\n${extraConfig}\n`);
  const child: ChildProcess = spawn(bin, ['-c', conf], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => { stderr += d.toString(); });
  const kill = () => { try { child.kill('SIGKILL'); } catch { /* gone */ } };
  process.once('exit', kill);
  const deadline = Date.now() + 15_000;
  let port = 0;
  while (!port) {
    if (child.exitCode !== null) throw new Error(`nats-server exited ${child.exitCode}: ${stderr}`);
    if (Date.now() > deadline) { kill(); throw new Error(`nats-server did not write its ports file: ${stderr}`); }
    const f = (await readdir(dir)).find((n) => n.endsWith('.ports'));
    if (f) {
      const ports = JSON.parse(await readFile(join(dir, f), 'utf8')) as { nats: string[] };
      const u = ports.nats[0];
      if (u) port = Number(new URL(u.replace(/^tls:/, 'nats:')).port);
    }
    if (!port) await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url: `${opts.scheme ?? 'nats'}://127.0.0.1:${port}`,
    port,
    dir,
    [Symbol.asyncDispose]: async () => {
      kill();
      await new Promise((r) => (child.exitCode !== null ? r(null) : child.once('exit', r)));
      process.removeListener('exit', kill);
      await rm(dir, { recursive: true, force: true });
    },
  };
}
