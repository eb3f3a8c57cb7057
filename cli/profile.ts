/** `hetps profile`: measure this node the way grouping sees it. */
import type { Command } from 'commander';
import { hostname } from 'node:os';
import { ConfigError } from '../runtime/errors.ts';
import { profileDevice } from '../native-bridge/profile.ts';
import { connectTransport } from '../runtime/connect.ts';
import { measureNodeProfile } from '../actors/node/node-profile.ts';

export function register(program: Command): void {
  program
    .command('profile')
    .description('measure this node: matmul GFLOP/s and embedding gather through ONNX Runtime, memory, CPUs, run-to-run variance')
    .option('--node <name>', 'node name to report', hostname())
    .option('--provider <p>', 'execution provider: cpu or cuda', 'cpu')
    .option('--repeats <n>', 'matmul repetitions (variance is their coefficient of variation)', '5')
    .option('--network', 'also measure rtt_ms and bandwidth_mbps to the NATS server (--nats), or on the in-process bus without it: a profile for `hetps plan groups`', false)
    .option('--nats <urls>', 'NATS URLs, comma-separated, for --network')
    .option('--json', 'print the profile as JSON on stdout', false)
    .action(async (o: { node: string; provider: string; repeats: string; network: boolean; nats?: string; json: boolean }) => {
      if (o.provider !== 'cpu' && o.provider !== 'cuda') throw new ConfigError(`--provider must be cpu or cuda, got ${JSON.stringify(o.provider)}`);
      const repeats = Number(o.repeats);
      if (!Number.isInteger(repeats) || repeats < 2) throw new ConfigError(`--repeats must be an integer ≥ 2, got ${o.repeats}`);
      const p = await profileDevice({
        node: o.node, provider: o.provider, repeats,
        onProgress: (step) => process.stderr.write(`profiling ${o.node}: ${step}\n`),
      });
      if (o.network || o.nats) {
        const servers = o.nats ? o.nats.split(',').map((u) => u.trim()).filter(Boolean) : null;
        if (!servers) process.stderr.write('profiling: no --nats given, network measured on the in-process bus (link: embedded)\n');
        const transport = await connectTransport({ servers, name: `profile-${o.node}` });
        try {
          const np = await measureNodeProfile({ transport, node: o.node, device: p });
          if (o.json) process.stdout.write(`${JSON.stringify(np)}\n`);
          else process.stdout.write(`node ${np.node}\n  matmul ${np.matmul_gflops} GFLOP/s (variance ${np.variance})\n  gather ${np.gather_rows_per_s} rows/s\n  ${np.cpus} CPUs, ${np.memory_gb} GiB, providers ${np.providers.join(', ')}\n  network (${np.link}): rtt ${np.rtt_ms} ms, ${np.bandwidth_mbps} Mbit/s client↔server\n`);
        } finally {
          await transport.close();
        }
        return;
      }
      if (o.json) process.stdout.write(`${JSON.stringify(p)}\n`);
      else {
        process.stdout.write(`node ${p.node}\n  matmul ${p.matmul_gflops} GFLOP/s (variance ${p.variance})\n  gather ${p.gather_rows_per_s} rows/s\n  ${p.cpus} CPUs, ${p.memory_gb} GiB, providers ${p.providers.join(', ')}\n`);
      }
    });
}
