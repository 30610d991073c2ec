/* memtrace view: the page itself (charts, landmarks, live set, tables), over the model in view.js.
 * State the tests read is kept in window.memtraceView (ranks[r].drawn, ranks[r].view, selected). */
(function () {
  'use strict';
  const MT = window.memtraceView, doc = window.__mtDoc, I = MT._internals, GAP = MT._gap;
  /* the timeline's own colours (plots/palette.py), carried by the page's data */
  const CAT_COLORS = (doc.ranks[0] && doc.ranks[0].category_colors) || ['#4C72B0', '#55A868', '#D63CBE', '#8172B2', '#F0A030', '#B0B0B0'];
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v; else if (k.startsWith('on')) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const c of kids) if (c != null) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  };
  const gib = window.memtraceUnits.formatGib; /* view_units.js: the reports' one unit rule */
  const formatSize = window.memtraceUnits.formatSize; /* torch's units: "27.56 MiB", "1.50 GiB" (units.format_size) */
  const bytes = (b) => Math.round(b).toLocaleString('en-US') + ' B';
  const exact = I.exact;
  const app = document.getElementById('mt-app');
  const GUTTER = 150; /* px right of the plot for the target and capacity labels */
  const PHASE_ROW = 16, MARK_ROW = 14, MARK_ROWS = 4; /* the strip above the plot: phase rows, then moments' names */
  let syncing = false;
  /* the KV cache committed through CUDA's VMM API (vLLM 0.34+): the timeline's hatched KV green (plots/palette.py) */
  const VMM_FILL = 'rgba(85,168,104,.45)', VMM_EDGE = '#1E6B35';
  const vmmLabel = () => (doc.ranks.find((r) => r.vmm) || {}).vmm?.label || 'KV cache outside PyTorch (CUDA VMM)';

  function header() {
    const r0 = doc.ranks[0];
    app.append(el('h1', {}, doc.title));
    if (doc.headline) app.append(el('p', { id: 'mt-headline', class: ['died', 'recorded nothing'].includes(doc.verdict) ? 'mt-headline mt-error' : 'mt-headline' }, doc.headline));
    const note = doc.ranks.some((r) => !r.has_events)
      ? (doc.api ? 'Served by memtrace view --serve: zoom and clicks are answered from the trace file.'
        : 'This run is too big for one page: it carries a coarse overview. Run `memtrace view --serve RUN` to zoom to exact steps.')
      : 'Drag to zoom, wheel to zoom around the cursor, double-click to reset; click a moment to see what was live.';
    app.append(el('p', { class: 'mt-note' }, note));
    if (r0 && r0.time_origin) app.append(el('p', { class: 'mt-note', id: 'mt-origin' }, `Times: ${r0.time_origin}`));
    for (const line of doc.missing || []) app.append(el('p', { class: 'mt-error mt-missing' }, line));
    if (doc.worst) app.append(el('p', { class: 'mt-note', id: 'mt-worst' }, doc.worst));
    return r0;
  }

  function legend() {
    const d = el('div', { class: 'mt-legend' });
    doc.ranks[0].categories.forEach((c, k) => d.append(el('span', {}, el('i', { style: `background:${CAT_COLORS[k]}` }), c.replace('_', ' '))));
    if (doc.ranks.some((r) => r.vmm)) d.append(el('span', { 'data-legend': 'vmm_kv' }, el('i', { style: `background:${VMM_FILL};border-top:1px solid ${VMM_EDGE}` }), vmmLabel()));
    /* only what some rank draws: a CPU profiler trace has no reserved, a trace without NVML no device used */
    const any = (f) => doc.ranks.some(f);
    if (any((r) => r.holds_reserved)) d.append(el('span', { 'data-legend': 'reserved' }, el('i', { style: 'background:#222;height:2px' }), 'reserved'));
    if (any((r) => r.has_device)) {
      d.append(el('span', { 'data-legend': 'device_used' }, el('i', { style: 'background:#8c564b;height:2px' }), 'device used (NVML)'));
      d.append(el('span', { 'data-legend': 'non_torch' }, el('i', { style: 'background:rgba(140,86,75,.25)' }), 'non-PyTorch'));
    }
    const others = doc.ranks.find((r) => r.others); /* other processes on the device: the band over device used */
    if (others) d.append(el('span', { 'data-legend': 'others' }, el('i', { style: 'background:rgba(184,196,206,.45);border-top:1px solid #5A6B7B' }), others.others.label));
    if (any((r) => r.target.bytes != null)) d.append(el('span', { 'data-legend': 'target' }, el('i', { style: 'background:#d62728;height:2px' }), 'target'));
    if (any((r) => r.target.capacity)) d.append(el('span', { 'data-legend': 'capacity' }, el('i', { style: 'background:#555;height:2px' }), 'capacity'));
    return d;
  }

  /* ---------- drawing on top of uPlot: phases, target, capacity, crossing, OOM, peak, selection ---------- */
  function overlay(R) {
    return (u) => {
      const m = R.meta, ctx = u.ctx, top = u.bbox.top, h = u.bbox.height, left = u.bbox.left, w = u.bbox.width;
      const dpr = devicePixelRatio || 1, X = (us) => u.valToPos(us / 1e6, 'x', true), Yp = (b) => u.valToPos(b, 'y', true);
      const drawn = { phases: 0, phase_names: [], target: null, capacity: null, crossing: null, oom: null, peak: null,
        labels: [], plot: { left: left / dpr, top: top / dpr, width: w / dpr, height: h / dpr } };
      ctx.save();
      /* the phase strip and the landmarks' names sit above the plot (uPlot's top padding), never on a curve */
      ctx.beginPath(); ctx.rect(left, 0, w, top + h); ctx.clip();
      ctx.font = `${11 * dpr}px sans-serif`; ctx.textBaseline = 'top'; ctx.textAlign = 'left';
      const band = PHASE_ROW * dpr, strip = top - R.strip * dpr;
      [...m.phases, ...(R.W ? R.W.meta.phases : [])].forEach((p, k) => { /* start-up's, then the window's */
        const a = Math.max(X(p.start_us), left), b = Math.min(X(p.end_us), left + w);
        if (b <= a) return;
        const y = strip + p.depth * band;
        ctx.fillStyle = p.depth === 0 ? (k % 2 ? 'rgba(0,0,0,.07)' : 'rgba(0,0,0,.13)') : (k % 2 ? 'rgba(31,119,180,.14)' : 'rgba(31,119,180,.24)');
        ctx.fillRect(a, y, b - a, band - 1 * dpr);
        ctx.strokeStyle = 'rgba(0,0,0,.25)'; ctx.beginPath(); ctx.moveTo(a, top); ctx.lineTo(a, top + h); ctx.stroke();
        ctx.fillStyle = '#333';
        if (ctx.measureText(p.name).width + 6 * dpr < b - a) ctx.fillText(p.name, a + 3 * dpr, y + 2 * dpr);
        drawn.phases++; drawn.phase_names.push(p.path);
      });
      const gutter = [], names = [];
      const hline = (bytes, color, label, dash) => {
        const y = Yp(bytes); if (y < top || y > top + h) return null;
        ctx.strokeStyle = color; ctx.lineWidth = 1.5 * dpr; ctx.setLineDash(dash || []);
        ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + w, y); ctx.stroke(); ctx.setLineDash([]);
        gutter.push([y, color, label]); /* labelled in the right margin, outside the plot */
        return Math.round(y / dpr);
      };
      if (m.target.bytes) drawn.target = hline(m.target.bytes, '#d62728', `target ${gib(m.target.bytes)} (${m.target.source})`, [6 * dpr, 4 * dpr]);
      if (m.target.capacity) drawn.capacity = hline(m.target.capacity, '#555', `capacity ${gib(m.target.capacity)}`);
      drawn.gap = R.W ? GAP.band(R, u, ctx, X, dpr) : null; /* over the curves and lines: nothing known there */
      /* a moment: its line across the plot, its name in its own row of the strip between the phases and the
       * plot (rising from the line into that row), so no name covers a curve or the target and capacity lines */
      const vline = (us, color, label, dash, row) => {
        const x = X(us); if (x < left || x > left + w) return null;
        const ty = top - (MARK_ROWS - (row || 0)) * MARK_ROW * dpr;
        ctx.strokeStyle = color; ctx.lineWidth = 1.5 * dpr; ctx.setLineDash(dash || []);
        ctx.beginPath(); ctx.moveTo(x, ty); ctx.lineTo(x, top + h); ctx.stroke(); ctx.setLineDash([]);
        const tw = ctx.measureText(label).width, tx = x + 3 * dpr + tw > left + w ? x - 3 * dpr - tw : x + 3 * dpr;
        names.push([label, color, tx, ty, tw]); /* written after every line, so no line runs through a name */
        drawn.labels.push({ label, x: Math.round(tx / dpr), y: Math.round(ty / dpr), w: Math.round(tw / dpr), h: 13 });
        return Math.round(x / dpr);
      };
      const c = m.crossings.length ? m.crossings[0] : null; /* the crossing every output names first */
      if (c) drawn.crossing = vline(c.time_us - m.t0_us, '#d62728', `crossed +${gib(c.overshoot_bytes)}`, [2 * dpr, 2 * dpr]);
      if (m.oom) drawn.oom = vline(m.oom.time_us - m.t0_us, '#000', m.oom.label, null, 2);
      drawn.peak = vline(m.peak_mark.time_us - m.t0_us, '#9467bd', `peak ${m.peak_bound.lower_bound ? 'at least ' : ''}${gib(m.peak_mark.bytes)} ${m.peak_mark.curve}`, [1 * dpr, 3 * dpr], 1);
      if (R.selectedUs != null) vline(R.selectedUs, '#17becf', 'selected', null, 3);
      for (const [label, color, tx, ty, tw] of names) {
        ctx.fillStyle = 'rgba(255,255,255,.92)'; ctx.fillRect(tx - 2 * dpr, ty, tw + 4 * dpr, 13 * dpr);
        ctx.fillStyle = color; ctx.fillText(label, tx, ty + 1 * dpr);
      }
      drawn.gutter = gutter.map(([y, , label]) => ({ label, y: Math.round(y / dpr) }));
      ctx.restore();
      ctx.save(); ctx.font = `${11 * dpr}px sans-serif`; ctx.textBaseline = 'middle'; ctx.textAlign = 'left';
      let last = -Infinity;
      for (const [y, color, label] of gutter.sort((a, b) => a[0] - b[0])) {
        const ty = Math.max(y, last + 13 * dpr); last = ty;
        ctx.fillStyle = color; ctx.fillText(label, left + w + 6 * dpr, ty, GUTTER * dpr - 8 * dpr);
      }
      ctx.restore();
      R.drawn = drawn; MT.ranks[R.index].drawn = drawn;
    };
  }

  function makeChart(R, host, width) {
    const K = R.meta.categories.length;
    const series = [{ label: 'time', value: (u, v) => (v == null ? '' : v.toFixed(6) + ' s') }];
    const stepped = uPlot.paths.stepped({ align: 1 });
    for (let k = K - 1; k >= 0; k--) series.push({ label: R.meta.categories[k], stroke: CAT_COLORS[k], fill: CAT_COLORS[k] + 'cc', width: 0.5, paths: stepped, points: { show: false } });
    series.push({ label: 'reserved', stroke: '#222', width: 1.5, paths: stepped, points: { show: false }, show: R.meta.holds_reserved });
    series.push({ label: 'device used', stroke: '#8c564b', width: 1.5, paths: stepped, points: { show: false } });
    const bands = [{ series: [K + 2, K + 1], fill: 'rgba(140,86,75,.25)', dir: 1 }];
    const vmm = R.meta.vmm; /* reserved + the VMM KV cache: series K + 3, the band between it and reserved */
    if (vmm) {
      series.push({ label: vmm.label, stroke: VMM_EDGE, width: 1, paths: stepped, points: { show: false } });
      bands.push({ series: [K + 3, K + 1], fill: VMM_FILL, dir: -1 });
    }
    if (R.meta.others) { /* device used + other processes (the whole device): the band over device used */
      series.push({ label: R.meta.others.label, stroke: '#5A6B7B', width: 1, paths: stepped, points: { show: false } });
      bands.push({ series: [series.length - 1, K + 2], fill: 'rgba(184,196,206,.45)', dir: -1 });
    }
    const parts = R.W ? [R.meta, R.W.meta] : [R.meta]; /* start-up, then its serving window */
    const maxY = Math.max(R.meta.target.capacity || 0, R.meta.target.bytes || 0, ...parts.map((m) => Math.max(m.peak.reserved_bytes, m.peak.allocated_bytes, m.vmm ? m.vmm.held_peak_bytes : 0))) * 1.04;
    const [unit, scale] = window.memtraceUnits.axisUnit(maxY); /* GiB, or KiB for a CPU profiler trace */
    const depth = Math.max(0, ...parts.flatMap((m) => m.phases.map((p) => p.depth + 1)));
    R.strip = depth * PHASE_ROW + MARK_ROWS * MARK_ROW + 4; /* px above the plot: phases, then moments' names */
    const opts = {
      width, height: 360 + R.strip, series, legend: { show: false }, padding: [R.strip + 4, GUTTER, 0, 0], bands,
      scales: { x: { time: false, range: (u, lo, hi) => [lo, hi], ...(doc.x_scale ? { distr: 100, fwd: MT.fwd, bwd: MT.bwd } : {}) }, y: { range: () => [0, maxY] } },
      axes: [doc.x_scale ? { label: 'seconds since start', splits: (u, ax, lo, hi) => GAP.ticks(u, lo, hi), filter: (u, vs) => vs /* uPlot would keep powers of 10 on a custom scale */, values: GAP.tickValues }
        : { label: 'seconds since start', values: (u, vs, ax, space, incr) => vs.map((v) => v.toFixed(Math.min(6, (String(+incr.toPrecision(6)).split('.')[1] || '').length))) },
        { label: unit, size: 60, incrs: [0.25, 0.5, 1, 2, 4, 8, 10, 16, 20, 32, 40, 64, 80, 128, 256, 512].map((g) => g * scale),
          values: (u, vs) => vs.map((v) => +(v / scale).toFixed(2)) }],
      cursor: { sync: { key: 'mt' }, drag: { x: true, y: false }, points: { show: false } },
      hooks: {
        draw: [overlay(R)],
        setCursor: [(u) => hover(R, u)],
        setScale: [(u, key) => { if (key === 'x') onZoom(R, u.scales.x.min, u.scales.x.max); }],
      },
    };
    const u = new uPlot(opts, [[0, 1], ...series.slice(1).map(() => [null, null])], host);
    wireMouse(R, u);
    return u;
  }

  function hover(R, u) {
    const i = u.cursor.idx, box = R.info;
    if (i == null || u.cursor.left < 0) return;
    const x = u.posToVal(u.cursor.left, 'x'), tus = x * 1e6, P = I.partAt(R, tus), m = (P || R).meta;
    const rows = [['time', (tus / 1e6).toFixed(6) + ' s']];
    if (!P) rows.push(...GAP.hoverRows()); /* in the gap: nothing kept */
    else rows.push(['phase', I.phaseAt(m, tus)]);
    if (P && P.L) {
      const e = I.upper(P.L.t, tus) - 1, s = I.stateAt(P, e), d = I.deviceAt(P, tus);
      rows.push(['event', e < 0 ? 'before the first' : `#${e} (${m.actions[P.col.act[e]]} ${Math.round(P.col.size[e]).toLocaleString('en-US')} B)`]);
      rows.push(...curveRows(m, s.alloc, s.res, d.used, d.nontorch));
      rows.push(...cuptiRows(P, tus), ...vmmRows(P, tus));
      m.categories.forEach((c, k) => { if (s.cats[k]) rows.push([c, exact(s.cats[k])]); });
    } else if (P) {
      const K = m.categories.length, v = (j) => u.data[j][i];
      rows.push(...curveRows(m, v(1), v(K + 1), v(K + 2), I.deviceAt(P, tus).nontorch));
      rows.push(...cuptiRows(P, tus), ...vmmRows(P, tus));
    }
    box.replaceChildren(el('table', {}, ...rows.map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, v)))));
    R.hover = { t_us: tus, rows: Object.fromEntries(rows) };
  }

  /* the curves' rows of the hover table: reserved only where the trace has it, NVML's only where sampled */
  function curveRows(m, alloc, res, used, nontorch) {
    const rows = [['allocated', exact(alloc)]];
    if (m.holds_reserved) rows.push(['reserved', exact(res)]);
    if (m.has_device) rows.push(['device used', exact(used)], ['non-PyTorch', exact(nontorch)]);
    return rows;
  }

  /* with CUPTI records: of NVML's non-PyTorch figure (the "non-PyTorch" row, as the report's), the
   * part CUPTI saw (exact) and the rest, unexplained (shown clipped at 0 when CUPTI saw more) */
  function cuptiRows(R, tus) {
    const c = I.cuptiAt(R, tus);
    if (c == null) return [];
    const rows = [['non-PyTorch seen by CUPTI', `${formatSize(c.seen)} (${bytes(c.seen)}, exact)`]];
    if (c.nvml == null) rows.push(['non-PyTorch unexplained', '— (no NVML samples)']);
    else {
      const rest = c.nvml - c.seen;
      rows.push(['non-PyTorch unexplained', rest >= 0 ? `${formatSize(rest)} (${bytes(rest)})`
        : `0 B (clipped at 0: CUPTI saw ${bytes(-rest)} more than NVML's non-PyTorch)`]);
    }
    return rows;
  }

  /* vLLM 0.34+: the KV cache committed through CUDA's VMM API at the cursor (exact: the plugin's records) */
  function vmmRows(R, tus) {
    const v = I.vmmAt(R, tus);
    return v == null ? [] : [[R.meta.vmm.label, exact(v)]];
  }

  function wireMouse(R, u) {
    let down = null;
    u.over.addEventListener('mousedown', (e) => { down = [e.clientX, e.clientY]; });
    u.over.addEventListener('mouseup', (e) => {
      if (!down || Math.abs(e.clientX - down[0]) > 3) { down = null; return; }
      down = null;
      const x = u.posToVal(e.clientX - u.over.getBoundingClientRect().left, 'x'), P = I.partAt(R, x * 1e6);
      if (!P) return selectGap(R, x * 1e6);
      MT.eventAt(P, x * 1e6).then((ev) => select(P, ev)).catch(report);
    });
    u.over.addEventListener('dblclick', () => zoomAll(R.meta.start_us / 1e6, endOf(R.meta) / 1e6));
    u.over.addEventListener('wheel', (e) => {
      e.preventDefault();
      const { min, max } = u.scales.x, x = MT.fwd(u.posToVal(e.clientX - u.over.getBoundingClientRect().left, 'x'));
      const f = e.deltaY < 0 ? 0.6 : 1 / 0.6, a = MT.fwd(min), b = MT.fwd(max); /* around the cursor, as drawn */
      zoomAll(MT.bwd(x - (x - a) * f), MT.bwd(x + (b - x) * f));
    }, { passive: false });
  }

  const endOf = (m) => (m.window ? m.window.end_us : m.end_us); /* a rank's last drawn moment: its window's end */
  function zoomAll(x0, x1) {
    const lo = Math.min(...doc.ranks.map((r) => r.start_us)) / 1e6, hi = Math.max(...doc.ranks.map(endOf)) / 1e6;
    x0 = Math.max(x0, lo); x1 = Math.min(x1, hi);
    if (!(x1 > x0)) x1 = x0 + 1e-6;
    MT.ranks.forEach((r) => r.u.setScale('x', { min: x0, max: x1 }));
  }
  MT.zoom = zoomAll;
  function reveal(R, x) { /* bring a moment into view, keeping the zoom */
    const { min, max } = R.u.scales.x, half = (MT.fwd(max) - MT.fwd(min)) / 2;
    if (x < min || x > max) zoomAll(MT.bwd(MT.fwd(x) - half), MT.bwd(MT.fwd(x) + half));
  }

  function onZoom(R, x0, x1) {
    if (x0 == null || R.loading === `${x0}:${x1}`) return;
    R.loading = `${x0}:${x1}`;
    MT.window(R, x0, x1, R.u.bbox.width / (devicePixelRatio || 1)).then((w) => {
      if (R.loading !== `${x0}:${x1}`) return;
      R.u.setData(w.data);
      R.view = { x0, x1, exact: w.exact, events: w.events, points: w.data[0].length };
      MT.ranks[R.index].view = R.view;
      if (!syncing) { syncing = true; MT.ranks.forEach((o) => { if (o !== R && (o.u.scales.x.min !== x0 || o.u.scales.x.max !== x1)) o.u.setScale('x', { min: x0, max: x1 }); }); syncing = false; }
    }).catch(report);
  }

  function report(err) { MT.errors.push(String(err && err.stack || err)); const p = el('p', { class: 'mt-error' }, String(err.message || err)); app.prepend(p); }

  /* ---------- the moment clicked: live total, icicle, holders, events around ---------- */
  /* P: a rank's start-up (the rank itself) or its serving window (R.W, analysed as a trace of its own) */
  function select(P, e) {
    if (e == null) return;
    const R = P.rank, t1 = performance.now();
    return MT.live(P, e).then((live) => {
      R.selectedUs = live.t_us; R.u.redraw(false);
      renderLive(P, live, R.landmark); R.landmark = null;
      MT.selected = { rank: R.index, part: P.part, event: e, t_us: live.t_us, live_bytes: live.total, count: live.count, ms: performance.now() - t1 };
    }).catch(report);
  }
  MT.select = (rank, e, part) => select(part === 'serving' ? MT.ranks[rank].W : MT.ranks[rank], e);
  function selectGap(R, tus) {
    R.selectedUs = tus; R.u.redraw(false); R.landmark = null;
    R.panel.replaceChildren(...GAP.panel(R, tus, el));
    MT.selected = { rank: R.index, part: 'gap', event: null, t_us: tus, live_bytes: null, count: null };
  }

  const CURVES = { device_used: 'NVML device used', reserved: 'PyTorch reserved', allocated: 'PyTorch allocated' };
  /* what a landmark marks, in the report's words: the crossing's curve and value, the OOM's phase */
  function landmarkLine(m, lm) {
    if (!lm || lm.bytes == null && lm.phase == null) return null;
    const what = lm.curve ? `${CURVES[lm.curve] || lm.curve} ${gib(lm.bytes)}` : '';
    const where = lm.phase != null ? ` in ${lm.phase || 'no phase'}` : '';
    const top = lm.max_bytes != null ? `; highest ${gib(lm.max_bytes)} in ${lm.max_phase || 'no phase'}` : '';
    return el('p', { class: 'mt-landmark-line', 'data-landmark': lm.name }, `${lm.name}: ${what} at ${((lm.time_us - m.t0_us) / 1e6).toFixed(3)} s${where}${top} (the live allocations below are PyTorch's alone)`);
  }

  function renderLive(P, live, lm) {
    const m = P.meta, p = P.rank.panel, what = P.part === 'serving' ? 'serving window event' : 'event';
    const head = el('h3', {}, `${m.label}: live after ${what} #${live.event} at ${(live.t_us / 1e6).toFixed(6)} s (${I.phaseAt(m, live.t_us)})`);
    const total = el('p', { class: 'mt-live-total' }, 'live: ', el('b', { 'data-bytes': String(live.total), id: `mt-live-${P.index}` }, exact(live.total)), ` in ${live.count.toLocaleString('en-US')} allocations`);
    const holders = el('table', { class: 'mt-table' }, el('tr', {}, el('th', {}, 'held by'), el('th', {}, 'bytes'), el('th', {}, 'allocations'), el('th', {}, 'share')));
    for (const g of live.groups.slice(0, 15)) holders.append(el('tr', {}, el('td', {}, g.title), el('td', { class: 'num', title: `${g.bytes} B` }, gib(g.bytes)), el('td', { class: 'num' }, g.count), el('td', { class: 'num' }, live.total ? (100 * g.bytes / live.total).toFixed(1) + ' %' : '')));
    const ev = el('table', { class: 'mt-table mt-events' }, el('tr', {}, ...['#', 'time (s)', 'action', 'bytes', 'category', 'where'].map((h) => el('th', {}, h))));
    for (const a of live.around) ev.append(el('tr', { class: a.index === live.event ? 'mt-here' : '' }, el('td', { class: 'num' }, a.index), el('td', { class: 'num' }, (a.t_us / 1e6).toFixed(6)), el('td', {}, a.action), el('td', { class: 'num' }, Math.round(a.size).toLocaleString('en-US')), el('td', {}, a.category), el('td', {}, a.where)));
    p.replaceChildren(head, ...[landmarkLine(m, lm)].filter(Boolean), total, el('h4', {}, 'Live allocations by stack (icicle: width = bytes)'), icicle(live), el('div', { class: 'mt-cols' }, el('div', {}, el('h4', {}, 'Top holders'), holders), el('div', {}, el('h4', {}, 'Events around'), ev)));
  }

  function icicle(live) {
    const root = { name: 'all', bytes: 0, kids: new Map() };
    for (const g of live.groups) {
      let n = root; n.bytes += g.bytes;
      for (const f of g.path) { let c = n.kids.get(f); if (!c) n.kids.set(f, (c = { name: f, bytes: 0, kids: new Map() })); c.bytes += g.bytes; n = c; }
    }
    const box = el('div', { class: 'mt-icicle' }); let depth = 0;
    const W = 100, ROW = 18;
    const walk = (n, x, d) => {
      if (!root.bytes || n.bytes / root.bytes < 0.002) return;
      const w = (W * n.bytes) / root.bytes; depth = Math.max(depth, d);
      box.append(el('div', { class: 'mt-node', style: `left:${x}%;width:${w}%;top:${d * ROW}px`, title: `${n.name}\n${exact(n.bytes)}` }, n.name));
      let cx = x;
      for (const c of [...n.kids.values()].sort((a, b) => b.bytes - a.bytes)) { walk(c, cx, d + 1); cx += (W * c.bytes) / root.bytes; }
    };
    walk(root, 0, 0);
    box.style.height = `${(depth + 1) * ROW + 2}px`;
    return box;
  }

  /* ---------- tables: phases, and the report as `memtrace report` prints it ---------- */
  function phaseTable(m) {
    if (!m.phase_table.length) return el('p', { class: 'mt-note mt-no-phases' }, 'No phases recorded.');
    /* the columns the trace has: no reserved ones for a CPU profiler trace, no device used without NVML */
    const cols = [...(m.holds_reserved ? [['reserved at start', 'start_reserved_bytes'], ['peak reserved', 'peak_reserved_bytes'], ['Δ reserved', 'delta_reserved_bytes']] : []),
      ['peak allocated', 'peak_allocated_bytes'], ...(m.has_device ? [['peak device used', 'peak_device_used_bytes']] : [])];
    const t = el('table', { class: 'mt-table' }, el('tr', {}, ...['phase', 'start (s)', 'end (s)', ...cols.map(([h]) => h)].map((h) => el('th', {}, h))));
    for (const p of m.phase_table) {
      t.append(el('tr', {}, el('td', { style: `padding-left:${0.4 + p.depth * 1.2}em` }, p.name),
        el('td', { class: 'num' }, ((p.start_us - m.t0_us) / 1e6).toFixed(3)), el('td', { class: 'num' }, ((p.end_us - m.t0_us) / 1e6).toFixed(3)),
        ...cols.map(([, k]) => p[k]).map((b) => el('td', { class: 'num', title: b == null ? '' : `${b} B` }, gib(b)))));
    }
    return t;
  }

  async function main() {
    header(); app.append(legend());
    const width = Math.max(600, (app.clientWidth || 1200) - 8); /* the window's width: the hover table goes below */
    for (const [index, meta] of doc.ranks.entries()) {
      const part = async (m, key, name) => {
        const col = I.columns(await I.inflate(document.getElementById(`mt-blob-${key}`).textContent), m.columns);
        return { index, part: name, meta: m, col, L: m.has_events ? I.buildLocal(m, col) : null };
      };
      const R = { ...(await part(meta, index, 'startup')), drawn: null, view: null };
      R.rank = R;
      if (meta.window) R.W = { ...(await part(meta.window, `${index}-serving`, 'serving')), rank: R };
      MT.ranks.push(R);
      const lane = el('section', { class: 'mt-lane' }, el('h2', {}, meta.label));
      if (meta.before_recording) lane.append(el('p', { class: 'mt-note mt-before' }, meta.before_recording.line));
      if (meta.serving && meta.serving.length) {
        lane.append(el('div', { class: 'mt-serving' }, el('h3', {}, meta.serving_heading),
          el('ul', {}, ...meta.serving.map((line) => el('li', {}, line)))));
      }
      const marks = el('div', { class: 'mt-landmarks' });
      for (const P of R.W ? [R, R.W] : [R]) { /* start-up's landmarks, then the serving window's */
        for (const lm of P.meta.landmarks) marks.append(el('button', { 'data-landmark': lm.name, onclick: () => { R.landmark = lm; reveal(R, (lm.time_us - meta.t0_us) / 1e6); select(P, lm.event); } }, lm.name));
      }
      marks.append(el('button', { onclick: () => zoomAll(meta.start_us / 1e6, endOf(meta) / 1e6) }, 'reset zoom'));
      const host = el('div', { class: 'mt-chart' }), info = el('div', { class: 'mt-info' });
      R.info = info; R.panel = el('div', { class: 'mt-live' }, el('p', { class: 'mt-note' }, 'Click the chart or a landmark to see what was live.'));
      lane.append(marks, el('div', { class: 'mt-row' }, host, info), R.panel, el('h3', {}, 'Phases'), phaseTable(meta));
      app.append(lane);
      R.u = makeChart(R, host, width);
    }
    app.append(el('h2', {}, 'Report'), el('pre', { class: 'mt-report' }, doc.report));
    if (doc.boot) app.append(el('h2', {}, 'What would make it boot'), el('pre', { class: 'mt-boot' }, doc.boot));
    zoomAll(-Infinity, Infinity);
    await new Promise((res) => { const wait = () => (MT.ranks.every((r) => r.view) ? res() : setTimeout(wait, 5)); wait(); });
    MT.ready = true;
  }
  const t0 = performance.now();
  main().then(() => { MT.loadMs = performance.now() - t0; document.body.setAttribute('data-ready', '1'); }).catch(report);
})();
