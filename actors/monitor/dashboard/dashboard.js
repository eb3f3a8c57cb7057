// The hetps dashboard: one server-sent event stream (/api/stream) with a snapshot a second.
(() => {
  'use strict';
  const $ = (id) => document.getElementById(id);
  const MAX_EVENTS = 500;
  const seen = new Map();
  const fmt = (x, d = 0) => (x === null || x === undefined || !Number.isFinite(x) ? '–' : x.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d }));
  const bytes = (b) => (b === null || b === undefined ? '–' : b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(2)} GiB` : b >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MiB` : `${(b / 1024).toFixed(0)} KiB`);
  const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;' })[c]);
  const series = { t: [], rate: [], loss: [], test: [], auc: [] };
  const width = () => Math.max(400, Math.min(900, window.innerWidth / 2 - 60));
  const rateChart = new uPlot({ width: width(), height: 220, series: [{}, { label: 'samples/s', stroke: '#1f77b4', width: 2 }], axes: [{ label: 's' }, {}], scales: { x: { time: false } } }, [[], []], $('rate-chart'));
  const lossChart = new uPlot({
    width: width(), height: 220,
    series: [{}, { label: 'training loss', stroke: '#ff7f0e', width: 2 }, { label: 'test loss', stroke: '#2ca02c', width: 2 }, { label: 'test AUC', stroke: '#9467bd', width: 2, scale: 'auc' }],
    axes: [{ label: 's' }, {}, { scale: 'auc', side: 1, grid: { show: false } }], scales: { x: { time: false }, auc: { range: [0.4, 1] } },
  }, [[], [], [], []], $('loss-chart'));
  const push = (p) => {
    series.t.push(p.t_s); series.rate.push(p.samples_per_s); series.loss.push(p.loss); series.test.push(p.test_loss); series.auc.push(p.test_auc);
  };
  const redraw = () => {
    rateChart.setData([series.t, series.rate]);
    lossChart.setData([series.t, series.loss, series.test, series.auc]);
  };
  const render = (snap) => {
    const s = snap.status;
    $('job').textContent = snap.job;
    $('state').textContent = snap.ended ? 'ended' : s ? s.state : 'no answer';
    $('rate').textContent = fmt(snap.point.samples_per_s, 0);
    if (s) {
      $('samples').textContent = fmt(s.progress.samples);
      $('batches').textContent = `${fmt(s.progress.batches_acked)} / ${fmt(s.progress.batches_total)}`;
      $('loss').textContent = fmt(s.progress.loss, 4);
      $('groups').tBodies[0].innerHTML = s.groups.map((g) => `<tr data-group="${esc(g.name)}"><td>${esc(g.name)}</td><td>${esc(g.sync_mode)}</td><td>${g.members.map((m) => `<span class="${esc(m.state)}">${esc(m.node)}</span>`).join(', ')}</td><td>${fmt(snap.groups[g.name]?.steps, 1)}</td><td>${fmt(snap.groups[g.name]?.gap, 1)}</td></tr>`).join('')
        || '<tr><td colspan="5">no groups (asp / bsp: one pool of workers)</td></tr>';
      $('nodes').tBodies[0].innerHTML = s.workers.map((w) => `<tr data-node="${esc(w.node)}"><td>${esc(w.node)}</td><td>${esc(w.group ?? '–')}</td><td>${esc(w.state)}</td><td class="${esc(w.health ?? '')}">${esc(w.health ?? '–')}</td><td>${fmt(w.steps)}</td><td>${fmt(w.samples_per_s, 0)}</td><td>${w.utilisation === null ? '–' : `${(100 * w.utilisation).toFixed(0)} %`}</td><td class="held" title="${esc((w.held ?? []).join(', '))}">${w.held_count == null ? '–' : fmt(w.held_count)}</td><td>${w.last_heartbeat_ms === null ? '–' : `${fmt(w.last_heartbeat_ms)} ms ago`}</td></tr>`).join('');
      $('shards').tBodies[0].innerHTML = s.shards.map((x) => `<tr data-shard="${esc(x.shard)}"><td>${esc(x.shard)}</td><td>${esc(x.primary)}</td><td>${esc(x.state)}</td><td>${fmt(x.pulls)}</td><td>${fmt(x.pushes)}</td><td>${fmt(x.rows)}</td><td>${bytes(x.bytes)}</td><td>${fmt(x.version)}</td></tr>`).join('');
      const load = s.shards.map((x) => (x.pulls ?? 0) + (x.pushes ?? 0));
      const mean = load.length ? load.reduce((a, b) => a + b, 0) / load.length : 0;
      const max = load.length ? Math.max(...load) : 0;
      const lb = s.load_balancing;
      const servers = lb && lb.loads ? Object.entries(lb.loads).map(([n, l]) => `${esc(n)} ${(l / 1e6).toFixed(2)} M`).join(', ') : null;
      $('shards').tFoot.innerHTML = `<tr><td colspan="8">requests per shard: max ${fmt(max)}, mean ${fmt(mean, 0)}, max/mean ${mean > 0 ? (max / mean).toFixed(2) : '–'}</td></tr>`
        + (lb ? `<tr data-testid="server-load"><td colspan="8">${lb.inactive ? `load balancing off: ${esc(lb.inactive)}`
          : `server load (parameter floats/s): ${servers ?? 'measuring…'}${lb.imbalance === null ? '' : `; imbalance ${lb.imbalance.toFixed(2)}`} (a primary moves past ${lb.threshold} held ${lb.sustain_seconds} s); ${lb.migrations.length} moved`}</td></tr>` : '');
      // Every event seen since the page opened (a snapshot carries only the latest few), newest first.
      for (const e of s.events) seen.set(`${e.at_ms}|${e.kind}|${e.node}|${e.text}`, e);
      const all = [...seen.values()].sort((x, y) => x.at_ms - y.at_ms).slice(-MAX_EVENTS);
      $('events').innerHTML = all.reverse().map((e) => `<li data-kind="${esc(e.kind)}"><time>${new Date(e.at_ms).toLocaleTimeString()}</time> <b>${esc(e.kind)}</b> ${esc(e.text)}</li>`).join('');
    }
    const total = snap.staleness.reduce((a, b) => a + b.count, 0);
    $('staleness').innerHTML = snap.staleness.map((b, i) => {
      const lo = i === 0 ? 0 : (snap.staleness[i - 1].le ?? 0) + 1;
      const label = b.le === null ? `> ${snap.staleness[i - 1].le}` : lo === b.le ? `${b.le}` : `${lo}–${b.le}`;
      const pct = total > 0 ? (100 * b.count) / total : 0;
      return `<div><span class="label">${label}</span><span class="bar" style="width:${(3 * pct).toFixed(1)}px"></span><span>${fmt(b.count)} (${pct.toFixed(1)} %)</span></div>`;
    }).join('');
    $('wire').innerHTML = `workers sent ${bytes(snap.wire.bytes_out)}, received ${bytes(snap.wire.bytes_in)}; compression: ${esc(snap.wire.compression)}`;
  };
  // A static report (hetps report RUN_DIR): the run's history and its last snapshot, no stream, no buttons.
  const report = window.HETPS_REPORT;
  if (report) {
    for (const p of report.history) push(p);
    redraw();
    if (report.last) render({ ...report.last, ended: true });
    $('state').textContent = 'ended (report)';
    for (const b of document.querySelectorAll('button[data-cmd]')) b.remove();
    return;
  }
  const source = new EventSource('/api/stream');
  source.addEventListener('history', (ev) => { for (const p of JSON.parse(ev.data)) push(p); redraw(); });
  source.onmessage = (ev) => { const snap = JSON.parse(ev.data); push(snap.point); redraw(); render(snap); };
  source.addEventListener('end', (ev) => {
    source.close();
    const snap = JSON.parse(ev.data);
    if (snap) { snap.ended = true; render(snap); }
    $('state').textContent = 'ended';
  });
  source.onerror = () => { if (source.readyState === EventSource.CLOSED) $('state').textContent = 'ended'; };
  for (const b of document.querySelectorAll('button[data-cmd]')) {
    b.addEventListener('click', async () => {
      const cmd = b.dataset.cmd;
      const body = cmd === 'pause' ? { reason: 'dashboard' } : cmd === 'regroup' ? { groups: null, reason: 'dashboard: recompute' } : {};
      $('reply').textContent = `ctl.${cmd} …`;
      try {
        const r = await fetch(`/api/ctl/${cmd}`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
        const j = await r.json();
        $('reply').textContent = `ctl.${cmd}: ${JSON.stringify(j.result ?? j.error ?? j)}`;
      } catch (e) {
        $('reply').textContent = `ctl.${cmd} failed: ${e.message}`;
      }
    });
  }
})();
