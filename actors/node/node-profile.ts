/**
 * A node's profile for grouping: the device profile (ONNX Runtime matmul and
 * gather, memory, variance) plus the network as this node sees it.
 *
 * Network, measured against the server this transport is connected to:
 * - `rtt_ms`: the least of small request/reply round trips to an echo this
 *   node subscribes itself — the link's own delay: the median carried the
 *   queueing of whatever else the machine and link were doing (10 workers
 *   joining at once on 2 cores measured 2.5 to 30 ms on like links, and
 *   grouping split a class by it). Both legs go through the server, so it
 *   is the latency of a request to a peer exactly as near to the server as
 *   this node.
 * - `bandwidth_mbps`: a few MiB in 256 KiB messages published to a subject
 *   this node subscribes itself, bytes over time until the last one is back.
 *   Every byte goes up to the server and down again over the same link, so
 *   this is client↔server bandwidth (the node's own link, full duplex), not
 *   node-to-node bandwidth across a cluster route. Two messages are in
 *   flight at a time and none is sent once the probe's time is up, so a slow
 *   link is never flooded (seconds of probe data queued ahead of the
 *   client's pings made its connection look stale). On a link so slow that
 *   only the first, untimed message comes back in time, it is that
 *   message's bytes, up and down, over its round trip; none at all is a
 *   TimeoutError (the profile reporter measures again with more time).
 * With `rounds` > 1 the probe runs that many times, a random pause apart,
 * and keeps the least round trip and the most bandwidth of any round: ten
 * nodes joining at once on 2 cores each probe while the others load data
 * and models, and one round can fall entirely into a busy moment (on like
 * 20 Mbit/s tc links two of four nodes measured 8.5 and 9.1 against 14
 * Mbit/s and a least round trip of 17 and 20 ms against 1.4 ms, and
 * grouping split their class in two); the pause, drawn afresh by each node,
 * keeps nodes that started together from probing in step again. Where a
 * full round takes too long (`roundsWithinMs`: behind a slow link its
 * megabytes take seconds), the later rounds measure round trips only: on
 * like 6 Mbit/s tc links two of four nodes measured a least round trip of
 * 17 and 22 ms against ~1.2 ms in their single round, and grouping split
 * their class.
 * On the in-process bus the same code runs; rtt is ~0 and bandwidth is memory
 * speed, and `link: 'embedded'` says so.
 *
 * Emulation (`nodes.<name>.emulate` in the YAML): `speed` scales matmul and
 * gather (a speed-0.5 node is half as fast as a speed-1 node on the same
 * box), `bandwidth_mbps` replaces the measured bandwidth (`link: 'emulated'`)
 * where the node holds its transfers (`link: hold`); a `link: tc` node is
 * behind a real limit, measured like any link;
 * any `emulate` sets `emulated: true` (speed 1 too: the node's step time is
 * emulated, whatever its factor).
 */
import type { Clock, Transport } from '../../runtime/mod.ts';
import { TimeoutError, probeSubject, systemClock } from '../../runtime/mod.ts';
import type { EmulateConfig, NodeProfile } from '../../topology/mod.ts';
import { heldBandwidthMbps } from '../../topology/mod.ts';
import type { DeviceProfile, ProfileOptions } from '../../native-bridge/mod.ts';

export interface NetworkProbeOptions {
  clock: Clock;
  /** Round trips for the rtt median. */
  rttSamples: number;
  /** Bytes sent for the bandwidth estimate. */
  bandwidthBytes: number;
  messageBytes: number;
  /** Upper bound on one round of the probe; bandwidth is what arrived by then if it runs out. */
  timeoutMs: number;
  /** Rounds of the probe: the least rtt and the most bandwidth of any round count (see the file comment). */
  rounds: number;
  /** Mean pause between rounds; each is drawn uniformly from half to one and a half of it. */
  roundGapMs: number;
  /**
   * A later round measures bandwidth only if the probe so far plus the last
   * full round's length fits in this: on a slow link, where a round takes
   * seconds, the first round's rate is the measurement (it is not in doubt).
   * The later rounds still measure round trips (milliseconds each), which a
   * busy moment can spoil on any link.
   */
  roundsWithinMs: number;
  /** Uniform in [0, 1), for the pauses. */
  random: () => number;
}

export const DEFAULT_NETWORK_PROBE: Omit<NetworkProbeOptions, 'clock' | 'random'> = {
  rttSamples: 25,
  bandwidthBytes: 8 * 1024 * 1024,
  messageBytes: 256 * 1024,
  timeoutMs: 1_500,
  rounds: 1,
  roundGapMs: 0,
  roundsWithinMs: Infinity,
};

export interface NetworkProbe {
  rtt_ms: number;
  bandwidth_mbps: number;
  link: 'nats' | 'embedded';
}

/** Bandwidth probe messages in flight at once (see measureNetwork). */
export const BANDWIDTH_WINDOW = 2;

/** Shortest time we divide by: the in-process bus can deliver 8 MiB in less than a timer tick. */
const MIN_ELAPSED_MS = 0.001;

/** Round trips and bandwidth between this transport and its server (see the file comment). */
export async function measureNetwork(transport: Transport, options: Partial<NetworkProbeOptions> = {}): Promise<NetworkProbe> {
  const o: NetworkProbeOptions = { clock: systemClock, random: Math.random, ...DEFAULT_NETWORK_PROBE, ...options };
  if (!Number.isInteger(o.rounds) || o.rounds < 1) throw new RangeError(`network probe rounds must be an integer ≥ 1, got ${o.rounds}`);
  let best: NetworkProbe | null = null;
  const started = o.clock.monotonic();
  let last = 0;
  for (let r = 0; r < o.rounds; r++) {
    // A full round only while it fits; after that, the round measures round trips alone (milliseconds).
    const full = r === 0 || o.clock.monotonic() - started + last <= o.roundsWithinMs;
    if (r > 0 && o.roundGapMs > 0) {
      await o.clock.sleep(o.roundGapMs * (0.5 + o.random()));
    }
    const t0 = o.clock.monotonic();
    let p: NetworkProbe;
    try {
      p = await probeOnce(transport, o, full);
      if (full) last = o.clock.monotonic() - t0;
    } catch (e) {
      // A later round that got nothing back in its time (the busy moment came then): the earlier rounds stand.
      if (best !== null && e instanceof TimeoutError) continue;
      throw e;
    }
    best = best === null ? p : { ...p, rtt_ms: Math.min(best.rtt_ms, p.rtt_ms), bandwidth_mbps: full ? Math.max(best.bandwidth_mbps, p.bandwidth_mbps) : best.bandwidth_mbps };
  }
  return best!;
}

/** One round: round trips, then (`withBandwidth`) bandwidth, within `o.timeoutMs`; without, bandwidth_mbps is NaN. */
async function probeOnce(transport: Transport, o: NetworkProbeOptions, withBandwidth: boolean): Promise<NetworkProbe> {
  const { clock } = o;
  const started = clock.monotonic();
  const left = () => Math.max(1, o.timeoutMs - (clock.monotonic() - started));

  const echoSubject = probeSubject(transport.clientId, 'echo');
  const echo = transport.subscribe(echoSubject, (m) => { if (m.reply) transport.publish(m.reply, m.data); });
  const rtts: number[] = [];
  try {
    await transport.flush(); // the server has the subscription before the first request
    const ping = new Uint8Array(16);
    await transport.request(echoSubject, ping, { timeoutMs: left() }); // warm-up, not counted
    // A third of the time at most, so bandwidth gets the rest; always one sample.
    for (let i = 0; i < o.rttSamples && (i === 0 || clock.monotonic() - started < o.timeoutMs / 3); i++) {
      const t0 = clock.monotonic();
      await transport.request(echoSubject, ping, { timeoutMs: left() });
      rtts.push(clock.monotonic() - t0);
    }
  } finally {
    echo.unsubscribe();
  }
  const rtt_ms = +(rtts.length ? Math.min(...rtts) : NaN).toFixed(4);
  if (!withBandwidth) return { rtt_ms, bandwidth_mbps: NaN, link: transport.kind };

  const bwSubject = probeSubject(transport.clientId, 'bandwidth');
  const count = Math.max(1, Math.ceil(o.bandwidthBytes / o.messageBytes));
  const payload = new Uint8Array(o.messageBytes);
  let received = 0;
  let receivedBytes = 0;
  let target = Infinity;
  let wake: (() => void) | null = null;
  const sink = transport.subscribe(bwSubject, (m) => {
    received++;
    receivedBytes += m.data.byteLength;
    if (wake && received >= target) wake();
  });
  /** Resolves once `n` messages are in, or when the probe's time is up. */
  const arrived = (n: number) => new Promise<void>((resolve) => {
    if (received >= n) { resolve(); return; }
    const timer = clock.setTimeout(() => { wake = null; resolve(); }, left());
    target = n;
    wake = () => { wake = null; timer.cancel(); resolve(); };
  });
  let elapsed: number;
  let bytes: number;
  try {
    await transport.flush();
    // One message first, not timed, so the subscription's set-up is not counted.
    const sentFirst = clock.monotonic();
    transport.publish(bwSubject, payload);
    await arrived(1);
    if (received < 1) throw new TimeoutError(`no ${o.messageBytes}-byte bandwidth probe message came back within ${o.timeoutMs} ms`);
    const firstMs = clock.monotonic() - sentFirst;
    const before = receivedBytes;
    const start = received;
    const t0 = clock.monotonic();
    // At most BANDWIDTH_WINDOW messages in flight, the next one sent as one comes back, and none once
    // the time is up: on a slow link a burst of the whole probe would queue seconds of data ahead of
    // the client's pings (its connection then looks stale and is dropped) and of the job's first requests.
    let sent = 0;
    while (sent < count && clock.monotonic() - started < o.timeoutMs) {
      while (sent < count && sent - (received - start) < BANDWIDTH_WINDOW) { transport.publish(bwSubject, payload); sent++; }
      await arrived(start + Math.min(count, sent - BANDWIDTH_WINDOW + 1));
    }
    await arrived(start + sent);
    elapsed = Math.max(MIN_ELAPSED_MS, clock.monotonic() - t0);
    bytes = receivedBytes - before;
    if (bytes === 0) {
      // A link so slow that only the first message came back in time: its round trip carried its bytes
      // up and down again one after the other, so twice its bytes over its time (an underestimate by the rtt).
      bytes = 2 * o.messageBytes;
      elapsed = Math.max(MIN_ELAPSED_MS, firstMs);
    }
  } finally {
    sink.unsubscribe();
  }
  return {
    rtt_ms,
    bandwidth_mbps: +((bytes * 8) / 1e6 / (elapsed / 1000)).toPrecision(4),
    link: transport.kind,
  };
}

export const DEFAULT_DEVICE_PROBE: Partial<ProfileOptions> = { repeats: 3, secondsPerRepeat: 0.25 };

export interface NodeProfileOptions {
  transport: Transport;
  node: string;
  emulate: EmulateConfig | null;
  /** A device profile measured earlier; null: measure now (about 1 s of ONNX Runtime, see DEFAULT_DEVICE_PROBE). */
  device: DeviceProfile | null;
  /** The network measured earlier (nodes sharing one machine and link); null: measure now. */
  networkProbe: NetworkProbe | null;
  deviceOptions: Partial<ProfileOptions>;
  network: Partial<NetworkProbeOptions>;
}

/** profileDevice + measureNetwork, with the node's emulation applied and labelled. */
export async function measureNodeProfile(opts: Partial<NodeProfileOptions> & { transport: Transport; node: string }): Promise<NodeProfile> {
  // Shorter than `hetps profile`'s default (5 × 0.3 s) so joining stays under ~2 s; lazy so a given device skips onnxruntime.
  const device = opts.device ?? await (await import('../../native-bridge/mod.ts')).profileDevice({ ...DEFAULT_DEVICE_PROBE, ...opts.deviceOptions, node: opts.node });
  const net = opts.networkProbe ?? await measureNetwork(opts.transport, opts.network ?? {});
  const emulate = opts.emulate ?? null;
  const speed = emulate?.speed ?? 1;
  return {
    node: opts.node,
    matmul_gflops: +(device.matmul_gflops * speed).toFixed(2),
    gather_rows_per_s: Math.round(device.gather_rows_per_s * speed),
    memory_gb: device.memory_gb,
    cpus: device.cpus,
    providers: [...device.providers],
    variance: device.variance,
    bandwidth_mbps: heldBandwidthMbps(emulate) ?? net.bandwidth_mbps,
    rtt_ms: net.rtt_ms,
    step_ms_variance: null,
    emulated: emulate !== null,
    // A tc-limited link (emulate.link tc) is a real one: measured like any other.
    link: heldBandwidthMbps(emulate) !== null ? 'emulated' : net.link,
  };
}
