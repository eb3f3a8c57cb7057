#!/usr/bin/env node
/**
 * A small NATS client for the network-lab tests, run inside a lab node's
 * namespace (plain JS: it starts fast and needs no loader).
 *
 *   netlab-client.mjs tick <subject> <url,url,…>
 *     publishes {"seq","at"} (at: Date.now()) every 50 ms, forever, with
 *     reconnect on; connection events go to stderr as JSON lines.
 *   netlab-client.mjs send <subject> <bytes> <url,url,…>
 *     publishes <bytes> bytes in 16000-byte messages, waits for the server
 *     to have them all (flush), prints {"bytes","ms"} and exits; ms runs
 *     from the first publish to the flush.
 *
 * NETLAB_PING_INTERVAL_MS sets the client's ping interval (default: the
 * client's 2 minutes; hetps nodes use 2 s, so they notice a dead link and
 * reconnect, where a quiet client rides it out on TCP).
 */
import { connect } from '@nats-io/transport-node';

const [mode, subject, ...rest] = process.argv.slice(2);

function fail(msg) {
  process.stderr.write(`netlab-client: ${msg}\n`);
  process.exit(2);
}

async function open(urls) {
  const nc = await connect({
    servers: urls.split(','),
    name: `netlab-${mode}`,
    maxReconnectAttempts: -1,
    reconnectTimeWait: 250,
    timeout: 2_000,
    // Only the URLs we were given: the servers' own list names addresses a namespace may not route to.
    ignoreClusterUpdates: true,
    ...(Number(process.env.NETLAB_PING_INTERVAL_MS) > 0 ? { pingInterval: Number(process.env.NETLAB_PING_INTERVAL_MS) } : {}),
  });
  void (async () => {
    for await (const s of nc.status()) {
      process.stderr.write(JSON.stringify({ status: s.type, server: s.server ?? null, at: Date.now() }) + '\n');
    }
  })();
  return nc;
}

if (!subject) fail('usage: netlab-client.mjs tick <subject> <urls> | send <subject> <bytes> <urls>');

if (mode === 'tick') {
  const [urls] = rest;
  if (!urls) fail('tick needs <urls>');
  const nc = await open(urls);
  process.stdout.write('connected\n');
  let seq = 0;
  const timer = setInterval(() => {
    seq++;
    try {
      nc.publish(subject, JSON.stringify({ seq, at: Date.now() }));
    } catch (e) {
      process.stderr.write(JSON.stringify({ publish_error: String(e), seq }) + '\n');
    }
  }, 50);
  const stop = () => { clearInterval(timer); void nc.close().finally(() => process.exit(0)); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
} else if (mode === 'send') {
  const [bytesText, urls] = rest;
  const total = Number(bytesText);
  if (!Number.isInteger(total) || total <= 0 || !urls) fail('send needs <bytes> (a positive whole number) and <urls>');
  const nc = await open(urls);
  const chunk = 16_000;
  const t0 = performance.now();
  for (let sent = 0; sent < total; sent += chunk) {
    nc.publish(subject, new Uint8Array(Math.min(chunk, total - sent)).fill(0x61));
  }
  await nc.flush();
  const ms = performance.now() - t0;
  process.stdout.write(JSON.stringify({ bytes: total, ms: Math.round(ms) }) + '\n');
  await nc.close();
  process.exit(0);
} else {
  fail(`unknown mode ${JSON.stringify(mode)}: tick or send`);
}
