/**
 * The dashboard's token (monitoring.auth: token), on a real HTTP server over
 * the in-process bus: every path answers 401 without it; the URL printed at
 * start (`?token=`) sets an HttpOnly, SameSite=Strict cookie and drops the
 * token from the address; the cookie or `Authorization: Bearer` is then
 * enough; a control command sent without it never reaches the scheduler.
 * Without a token nothing is asked for.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { InProcessBroker, connectTransport, silentLogger, systemClock, type Transport } from '../../runtime/mod.ts';
import { createMonitorActor } from '../../actors/monitor/monitor.actor.ts';
import { JobWatch, MonitorServer, newDashboardToken } from '../../actors/monitor/monitor-http.ts';

async function lab(token: string | null): Promise<{ server: MonitorServer; transport: Transport; commands: string[]; close(): Promise<void> }> {
  const transport = await connectTransport({ servers: null, broker: new InProcessBroker(), name: 'driver' });
  const monitor = createMonitorActor({ transport, job: 'j', clock: systemClock, log: silentLogger() });
  const watch = new JobWatch({ job: 'j', transport, monitor, everyMs: 60_000, compression: null });
  // The job's scheduler, as far as the page's commands go: it counts what reaches it and answers.
  const commands: string[] = [];
  const sub = transport.subscribe('hps.j.ctl.*', (m) => {
    commands.push(m.subject.slice('hps.j.ctl.'.length));
    if (m.reply) transport.publish(m.reply, new TextEncoder().encode(JSON.stringify({ type: 'reply', result: { ok: true } })));
  });
  const server = await MonitorServer.start({ port: 0, host: '127.0.0.1', token, job: 'j', transport, watch, log: silentLogger() });
  return {
    server, transport, commands,
    async close() { await server.close(); sub.unsubscribe(); await watch.end(); await transport.close(); },
  };
}

test('monitoring.auth token: nothing without the token; the printed URL sets a cookie and leaves the address; the cookie or a bearer header opens every path', async () => {
  const token = newDashboardToken();
  assert.match(token, /^[0-9a-f]{64}$/);
  const l = await lab(token);
  try {
    const base = l.server.url;
    assert.equal(l.server.loginUrl, `${base}?token=${token}`);
    for (const path of ['', 'metrics', 'api/snapshot', 'assets/dashboard.js']) {
      const r = await fetch(`${base}${path}`);
      assert.equal(r.status, 401, `/${path} without the token`);
      assert.match(((await r.json()) as { error: string }).error, /asks for the job's token: open the URL `hetps up` printed \(…\/\?token=…\), or send Authorization: Bearer <token>/);
    }
    const post = await fetch(`${base}api/ctl/pause`, { method: 'POST', body: '{}' });
    assert.equal(post.status, 401);
    assert.equal((await fetch(`${base}?token=${'0'.repeat(64)}`, { redirect: 'manual' })).status, 401, 'a wrong token');
    assert.equal((await fetch(`${base}metrics`, { headers: { Authorization: `Bearer ${token.slice(1)}x` } })).status, 401, 'a wrong bearer');
    assert.equal((await fetch(`${base}api/ctl/pause`, { method: 'POST', body: '{}', headers: { Cookie: `hetps_token=${'f'.repeat(64)}` } })).status, 401, 'a wrong cookie');
    assert.deepEqual(l.commands, [], 'no command reached the scheduler');

    const login = await fetch(l.server.loginUrl, { redirect: 'manual' });
    assert.equal(login.status, 303);
    assert.equal(login.headers.get('location'), '/', 'the token leaves the address');
    const cookie = login.headers.get('set-cookie') ?? '';
    assert.match(cookie, new RegExp(`^hetps_token=${token}; HttpOnly; SameSite=Strict; Path=/$`));
    const jar = { Cookie: cookie.split(';')[0]! };
    const page = await fetch(base, { headers: jar });
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-type') ?? '', /text\/html/);
    assert.equal((await fetch(`${base}api/snapshot`, { headers: jar })).status, 200);
    const metrics = await fetch(`${base}metrics`, { headers: { Authorization: `Bearer ${token}` } });
    assert.equal(metrics.status, 200);
    assert.match(await metrics.text(), /hetps_/);
    const paused = await fetch(`${base}api/ctl/pause`, { method: 'POST', body: '{}', headers: jar });
    assert.equal(paused.status, 200);
    assert.deepEqual(await paused.json(), { type: 'reply', result: { ok: true } });
    assert.deepEqual(l.commands, ['pause'], 'with the cookie the command reached the scheduler');
    // Other query parameters survive the redirect.
    const kept = await fetch(`${base}api/snapshot?token=${token}&x=1`, { redirect: 'manual' });
    assert.equal(kept.headers.get('location'), '/api/snapshot?x=1');
  } finally {
    await l.close();
  }
});

test('monitoring.auth none: no token asked for', async () => {
  const l = await lab(null);
  try {
    assert.equal(l.server.loginUrl, l.server.url);
    assert.equal((await fetch(l.server.url)).status, 200);
    assert.equal((await fetch(`${l.server.url}metrics`)).status, 200);
    assert.equal((await fetch(`${l.server.url}api/ctl/status`, { method: 'POST', body: '{}' })).status, 200);
    assert.deepEqual(l.commands, ['status']);
  } finally {
    await l.close();
  }
});
