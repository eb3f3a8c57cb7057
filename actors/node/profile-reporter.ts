/**
 * A worker's profile, from joining to the end of training (the article's
 * §3.1: every node is measured when it joins, and grouping is kept up to
 * date while the job runs).
 *
 * - Join: measure the node (actors/node/node-profile.ts: device through ONNX
 *   Runtime, rtt and bandwidth to the NATS server, emulation applied and
 *   labelled) with a short probe (`cluster.profiling.probe_seconds`, 0.5 s
 *   by default), put it in the job's profile store, where the driver
 *   reads it whatever the start order, then publish it on
 *   `hps.<job>.tel.profile.<node>` (a watcher that sees it finds it in the
 *   store). Until the worker has the job, the profile is put again every few
 *   seconds: a driver that starts later empties the store first.
 * - Training: keep the node's recent step times (the batches' step time as
 *   the — possibly emulated — device took it) and every
 *   `cluster.profiling.republish_seconds` (30 s by default) publish and
 *   store the profile again with `step_ms_variance`: the coefficient of
 *   variation (sd / mean) of those step times, the same measure as the join
 *   profile's `variance` of matmul runs, which grouping prefers once known.
 *   Compute, memory and network stay as measured at join: re-measuring would
 *   take the node's cores from its training.
 */
import { z } from 'zod';
import type { Clock, Logger, Timer, Transport } from '../../runtime/mod.ts';
import type { EmulateConfig, NodeProfile } from '../../topology/mod.ts';
import { coefficientOfVariation, profileDevice, type DeviceProfile, type ExecutionProvider, type ProfileOptions } from '../../native-bridge/mod.ts';
import { measureNetwork, measureNodeProfile, type NetworkProbe, type NetworkProbeOptions } from './node-profile.ts';
import type { ProfileStore } from '../store/profile-store.ts';
import { publishTelemetry, type ProfileTelemetry } from '../monitor/telemetry.ts';

/** Step times kept for `step_ms_variance`. */
export const PROFILE_STEP_WINDOW = 50;
/** Rounds of the join's network probe (see probeSettings). */
export const JOIN_PROBE_ROUNDS = 3;
/**
 * The join probe again when its first try ran out of time (a link slower
 * than ~20 Mbit/s: a 256 KiB message up and back does not fit in 0.3 s; a
 * busy machine): rounds of up to 5 s, later ones' throughput only while the
 * probe fits in 4 s, so a 20 Mbit/s link still gets its three rounds (~0.5 s
 * each) and a 2 Mbit/s one measures throughput once (~5 s) and round trips
 * three times.
 */
export const RETRY_ROUND_MS = 5_000;
export const RETRY_ROUNDS_WITHIN_MS = 4_000;
/** How often a worker waiting for the job puts its profile again. */
export const PROFILE_REFRESH_MS = 2_000;

/**
 * The device and network probe for about `probeSeconds`: 70% to the device
 * (three matmul runs for the variance, one gather), the rest to each of the
 * network's three rounds, which get at least 300 ms each so a loaded
 * machine's first round trip still fits, a random ~300 ms apart (the least
 * round trip and the most bandwidth of the three count: a node probing in a
 * busy moment of a machine or link gets two more chances; see
 * node-profile.ts). A join probe takes ~1.5 s of network at the default 0.5 s.
 */
export function probeSettings(probeSeconds: number, provider: ExecutionProvider = 'cpu'): { device: Partial<ProfileOptions>; network: Partial<NetworkProbeOptions> } {
  const repeats = 3;
  return {
    device: { provider, repeats, secondsPerRepeat: (0.7 * probeSeconds) / (repeats + 1) },
    network: { rttSamples: 10, bandwidthBytes: 1024 * 1024, messageBytes: 256 * 1024, timeoutMs: Math.max(300, 300 * probeSeconds), rounds: JOIN_PROBE_ROUNDS, roundGapMs: 300 },
  };
}

/**
 * One machine's device and link, measured once by `hetps up` for the node
 * processes it launches there (`hetps launch --host-profile FILE`): ten
 * processes timing the same two cores at once would each measure the others.
 */
export const hostProfileSchema = z.object({
  provider: z.enum(['cpu', 'cuda']),
  device: z.object({
    node: z.string(),
    matmul_gflops: z.number().positive(),
    gather_rows_per_s: z.number().positive(),
    memory_gb: z.number().positive(),
    cpus: z.number().int().positive(),
    providers: z.array(z.enum(['cpu', 'cuda'])),
    variance: z.number().nonnegative(),
  }),
  network: z.object({ rtt_ms: z.number().nonnegative(), bandwidth_mbps: z.number().positive(), link: z.enum(['nats', 'embedded']) }).nullable(),
});
export type HostProfile = z.infer<typeof hostProfileSchema>;

/** This machine's device (and, given a transport, its link to NATS) with the join probe's settings. */
export async function measureHostProfile(o: { probeSeconds: number; provider: ExecutionProvider; transport: Transport | null; node: string }): Promise<HostProfile> {
  const probe = probeSettings(o.probeSeconds, o.provider);
  const device = await profileDevice({ ...probe.device, node: o.node });
  let network: NetworkProbe | null = null;
  if (o.transport) {
    try {
      network = await measureNetwork(o.transport, probe.network);
    } catch {
      network = null; // each node measures its own then
    }
  }
  return { provider: o.provider, device, network };
}

export interface ProfileReporterOptions {
  transport: Transport;
  job: string;
  node: string;
  emulate: EmulateConfig | null;
  provider: ExecutionProvider;
  store: ProfileStore;
  clock: Clock;
  log: Logger;
  probeSeconds: number;
  /** 0: publish at join only. */
  republishMs: number;
  /**
   * The device profile to use instead of measuring one: nodes sharing one
   * machine (embedded mode; the processes `hetps up` launches) share one
   * measurement of it, taken once, rather than each timing the same cores
   * while the others do too (each node still applies its own emulation).
   */
  device?: ((provider: ExecutionProvider) => Promise<DeviceProfile>) | null;
  /** Likewise the network, for nodes on one machine and one link to NATS (the processes `hetps up` launches). */
  network?: NetworkProbe | null;
}

export class ProfileReporter {
  private readonly steps: number[] = [];
  private stepsSincePublish = 0;
  private timer: Timer | null = null;
  private refresh: Timer | null = null;

  private constructor(private readonly o: ProfileReporterOptions, private current: ProfileTelemetry) {}

  /** Measures the node, publishes the profile and puts it in the store. */
  static async join(o: ProfileReporterOptions): Promise<ProfileReporter> {
    const started = o.clock.monotonic();
    const probe = probeSettings(o.probeSeconds, o.provider);
    const device = o.device ? await o.device(o.provider) : null;
    const networkProbe = o.network ?? null;
    const measure = (network: Partial<NetworkProbeOptions>) => measureNodeProfile({
      transport: o.transport, node: o.node, emulate: o.emulate, device, deviceOptions: probe.device, network, networkProbe,
    });
    let profile: NodeProfile;
    try {
      profile = await measure(probe.network);
    } catch (e) {
      // A round trip slower than the short probe allows (a machine busy starting many nodes): once more, with time to spare.
      o.log.warn({ err: (e as Error).message }, `profile of ${o.node}: the network probe did not finish in ${probe.network.timeoutMs} ms; measuring again with 5 s a round`);
      profile = await measure({ ...probe.network, timeoutMs: RETRY_ROUND_MS, roundsWithinMs: RETRY_ROUNDS_WITHIN_MS });
    }
    const t: ProfileTelemetry = {
      ...profile, phase: 'join', steps: 0, probe_ms: Math.round(o.clock.monotonic() - started),
      device_from: device ? 'host' : 'node', network_from: networkProbe ? 'host' : 'node',
    };
    const reporter = new ProfileReporter(o, t);
    await reporter.publish();
    return reporter;
  }

  get profile(): ProfileTelemetry { return { ...this.current, providers: [...this.current.providers] }; }

  /** Puts the profile again every PROFILE_REFRESH_MS until `stopRefreshing` (while the worker waits for the job). */
  keepStored(): void {
    this.refresh ??= this.o.clock.setInterval(() => {
      this.o.store.put(this.current).catch((e: unknown) => this.o.log.debug({ err: (e as Error).message }, 'profile store not writable yet'));
    }, PROFILE_REFRESH_MS);
  }

  stopRefreshing(): void { this.refresh?.cancel(); this.refresh = null; }

  /** One trained step's time, as the device took it (emulated step time on an emulated node). */
  noteStep(ms: number | null): void {
    if (ms === null || !Number.isFinite(ms) || ms < 0) return;
    this.steps.push(ms);
    if (this.steps.length > PROFILE_STEP_WINDOW) this.steps.splice(0, this.steps.length - PROFILE_STEP_WINDOW);
    this.stepsSincePublish++;
  }

  /** Starts the periodic re-publishing (no-op when republishMs is 0). */
  startTraining(): void {
    this.stopRefreshing();
    if (this.o.republishMs <= 0 || this.timer) return;
    this.timer = this.o.clock.setInterval(() => { void this.republish(); }, this.o.republishMs);
  }

  /** Publishes the profile with the current step-time variation, if steps ran since the last one. Returns whether it did. */
  async republish(): Promise<boolean> {
    if (this.stepsSincePublish === 0 || this.steps.length < 2) return false;
    this.current = { ...this.current, phase: 'training', steps: this.steps.length, step_ms_variance: +coefficientOfVariation(this.steps).toFixed(4) };
    this.stepsSincePublish = 0;
    await this.publish();
    return true;
  }

  stop(): void {
    this.stopRefreshing();
    this.timer?.cancel();
    this.timer = null;
  }

  /** Stored first, then published: whoever sees the telemetry finds the same profile in the store (unless the put failed). */
  private async publish(): Promise<void> {
    await this.o.store.put(this.current).catch((e: unknown) => {
      // The telemetry still goes out; the store is retried by keepStored / the next republish.
      this.o.log.warn({ err: (e as Error).message }, `could not store the profile of ${this.o.node}`);
    });
    publishTelemetry(this.o.transport, this.o.job, 'profile', this.o.node, this.current);
  }
}
