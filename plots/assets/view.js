/* memtrace view: the page's code. Reads the data memtrace packed (plots/view_data.py), draws one uPlot
 * chart per rank on a shared time axis, and answers "what was live here" from the event arrays.
 * No network: a page written by `memtrace view --serve` asks only the server it came from. */
(function () {
  'use strict';
  const MT = (window.memtraceView = { ready: false, errors: [], ranks: [], selected: null });
  window.addEventListener('error', (e) => MT.errors.push(String(e.message || e)));
  window.addEventListener('unhandledrejection', (e) => MT.errors.push(String(e.reason)));
  const doc = JSON.parse(document.getElementById('mt-doc').textContent);
  const ALLOC = 0, FREE = 2, SEG_UP = [3, 5], SEG_DOWN = [4, 6];
  const CAT_COLORS = ['#4e79a7', '#59a14f', '#e15759', '#b07aa1', '#f28e2b', '#bab0ac'];
  const el = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'class') e.className = v; else if (k.startsWith('on')) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const c of kids) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return e;
  };
  const U = window.memtraceUnits; /* view_units.js: the reports' one unit rule */
  const exact = (b) => (b == null ? '—' : U.formatGib(b) + ' (' + Math.round(b).toLocaleString('en-US') + ' B)');
  const secs = (us) => (us / 1e6).toFixed(6) + ' s';
  function upper(arr, v, lo, hi) { /* first index with arr[i] > v */
    lo = lo || 0; hi = hi == null ? arr.length : hi;
    while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] <= v) lo = m + 1; else hi = m; }
    return lo;
  }

  /* ---------- decoding ---------- */
  async function inflate(b64) {
    const bin = atob(b64), u = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) u[i] = bin.charCodeAt(i);
    const s = new Blob([u]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(s).arrayBuffer();
  }
  const VIEWS = { '<u4': Uint32Array, '|u1': Uint8Array, '|i1': Int8Array, '<f8': Float64Array, '<i4': Int32Array };
  function columns(buf, table) {
    const out = {};
    for (const c of table) out[c.name] = new VIEWS[c.dtype](buf, c.offset, c.length);
    return out;
  }

  /* ---------- one rank's model, computed from the event arrays ---------- */
  function buildLocal(meta, col) {
    const n = meta.n_events, K = meta.categories.length, OTHER = K - 1;
    const t = new Float64Array(n), alloc = new Float64Array(n), res = new Float64Array(n), cats = new Float64Array(n * K);
    let tt = meta.first_event_us, a = meta.baseline.allocated, r = meta.baseline.reserved;
    const cur = new Float64Array(K); cur[OTHER] = a;
    const { dt, act, cat, size } = col;
    for (let i = 0; i < n; i++) {
      tt += dt[i]; t[i] = tt;
      const ac = act[i];
      if (ac === ALLOC) { a += size[i]; cur[cat[i]] += size[i]; }
      else if (ac === FREE) { a -= size[i]; cur[cat[i]] -= size[i]; }
      else if (ac === SEG_UP[0] || ac === SEG_UP[1]) r += size[i];
      else if (ac === SEG_DOWN[0] || ac === SEG_DOWN[1]) r -= size[i];
      alloc[i] = a; res[i] = r; cats.set(cur, i * K);
    }
    return { t, alloc, res, cats, K };
  }
  function stateAt(R, i) { /* values after event i (-1: the baseline) */
    const m = R.meta, K = m.categories.length;
    if (i < 0) { const c = new Float64Array(K); c[K - 1] = m.baseline.allocated; return { alloc: m.baseline.allocated, res: m.baseline.reserved, cats: c }; }
    return { alloc: R.L.alloc[i], res: R.L.res[i], cats: R.L.cats.subarray(i * K, i * K + K) };
  }
  function deviceAt(R, tus) {
    const c = R.col, i = upper(c.dev_t, tus) - 1;
    return i < 0 ? { used: null, nontorch: null } : { used: c.dev_used[i], nontorch: c.dev_nontorch[i] };
  }
  /* with CUPTI records (the cupti_* columns), at tus: the non-PyTorch bytes CUPTI saw live
   * (non_torch.live_curve's step in force, 0 before the first) and NVML's non-PyTorch figure then
   * (dev_nontorch: the report's steady one; null before the first sample or without samples);
   * null without records */
  function cuptiAt(R, tus) {
    const c = R.col;
    if (!c.cupti_t) return null;
    const i = upper(c.cupti_t, tus) - 1;
    return { seen: i < 0 ? 0 : c.cupti_bytes[i], nvml: deviceAt(R, tus).nontorch };
  }
  /* with the vmm_* columns (vLLM 0.34+: the KV cache committed through CUDA's VMM API, outside PyTorch):
   * the bytes in force at tus (0 before the first step); null without them */
  function vmmAt(R, tus) {
    const c = R.col;
    if (!c.vmm_t) return null;
    const i = upper(c.vmm_t, tus) - 1;
    return i < 0 ? 0 : c.vmm_kv[i];
  }
  /* with the oth_* columns (other processes on the device, NVML's per-process list): their bytes in force at tus
   * (their first figure before it was first read); null without them */
  function othersAt(R, tus) {
    const c = R.col;
    if (!c.oth_t || !c.oth_t.length) return null;
    return c.oth_bytes[Math.max(upper(c.oth_t, tus) - 1, 0)];
  }
  /* a window's data with one more series after the others: device used + other processes in force (the top of
   * the band of the other processes' memory: the whole device); unchanged without the oth_* columns */
  function withOthers(R, data) {
    if (!R.col.oth_t) return data;
    const DEV = R.meta.categories.length + 2;
    return [...data, data[0].map((x, i) => (data[DEV][i] == null ? null : data[DEV][i] + othersAt(R, x * 1e6)))];
  }
  /* a window's data with one more series: reserved + the VMM KV cache in force (the band's top), every step
   * of the VMM curve inside the window inserted as a point carrying the other series' values; unchanged
   * without the vmm_* columns. data = [X, categories..., reserved, device used] */
  function withVmm(R, data) {
    const c = R.col;
    if (!c.vmm_t) return data;
    const X = data[0], n = data.length, RES = n - 2, out = Array.from({ length: n + 1 }, () => []);
    const x0 = X.length ? X[0] : 0, x1 = X.length ? X[X.length - 1] : 0;
    const steps = [];
    for (let j = 0; j < c.vmm_t.length; j++) { const x = c.vmm_t[j] / 1e6; if (x > x0 && x < x1) steps.push(x); }
    let a = 0, b = 0, last = -1;
    while (a < X.length || b < steps.length) {
      if (b >= steps.length || (a < X.length && X[a] <= steps[b])) { last = a; out[0].push(X[a++]); }
      else out[0].push(steps[b++]);
      for (let k = 1; k < n; k++) out[k].push(last >= 0 ? data[k][last] : null);
      const x = out[0][out[0].length - 1], r = out[RES][out[RES].length - 1];
      out[n].push(r == null ? null : r + vmmAt(R, x * 1e6));
    }
    return out;
  }
  function phaseAt(meta, tus) {
    let best = null;
    for (const p of meta.phases) if (p.start_us <= tus && tus < p.end_us && (!best || p.depth >= best.depth)) best = p;
    return best ? best.path : '(no phase)';
  }

  /* the chart's series for one window: x in seconds; stacked categories (top first), reserved, device used */
  function pushState(Y, K, s) {
    let cum = 0; const cs = [];
    for (let k = 0; k < K; k++) { cum += s.cats[k]; cs.push(cum); }
    for (let k = 0; k < K; k++) Y[k].push(cs[K - 1 - k]);
    Y[K].push(s.res);
  }
  function windowLocal(R, x0, x1, W) {
    const L = R.L, K = L.K, t0 = x0 * 1e6, t1 = x1 * 1e6;
    const i0 = upper(L.t, t0) - 1, i1 = upper(L.t, t1);
    const ex = [], Y = Array.from({ length: K + 1 }, () => []);
    ex.push(x0); pushState(Y, K, stateAt(R, i0));
    const count = i1 - i0 - 1, isExact = count <= 4 * W;
    if (isExact) {
      for (let i = i0 + 1; i < i1; i++) { ex.push(L.t[i] / 1e6); pushState(Y, K, stateAt(R, i)); }
    } else {
      const bw = (t1 - t0) / W;
      let i = i0 + 1;
      for (let b = 0; b < W && i < i1; b++) {
        const end = t0 + (b + 1) * bw; let hi = -1, lo = -1, rmax = -Infinity, rmin = Infinity;
        for (; i < i1 && L.t[i] <= end; i++) {
          if (hi < 0 || L.alloc[i] > L.alloc[hi]) hi = i;
          if (lo < 0 || L.alloc[i] < L.alloc[lo]) lo = i;
          if (L.res[i] > rmax) rmax = L.res[i];
          if (L.res[i] < rmin) rmin = L.res[i];
        }
        if (hi < 0) continue;
        const sh = stateAt(R, hi), sl = stateAt(R, lo);
        ex.push((t0 + b * bw) / 1e6); pushState(Y, K, { ...sh, res: rmax });
        ex.push((t0 + (b + 0.5) * bw) / 1e6); pushState(Y, K, { ...sl, res: rmin });
        const last = stateAt(R, i - 1);
        ex.push(Math.min(end, L.t[i - 1]) / 1e6); pushState(Y, K, last);
      }
    }
    return mergeDevice(R, x0, x1, W, ex, Y, isExact, count);
  }
  function mergeDevice(R, x0, x1, W, ex, Y, isExact, count) {
    const c = R.col, t0 = x0 * 1e6, t1 = x1 * 1e6;
    const j0 = Math.max(upper(c.dev_t, t0) - 1, 0), j1 = upper(c.dev_t, t1);
    let dx = [], dv = [];
    const step = Math.max(1, Math.ceil((j1 - j0) / (4 * W)));
    for (let j = j0; j < j1; j += step) {
      let m = j;
      for (let q = j; q < Math.min(j + step, j1); q++) if (c.dev_used[q] > c.dev_used[m]) m = q;
      dx.push(Math.max(c.dev_t[j], t0) / 1e6); dv.push(c.dev_used[m]);
    }
    /* merge the event points and the sample points on one x axis, carrying each curve's last value */
    const K1 = Y.length, X = [], out = Array.from({ length: K1 + 1 }, () => []);
    let a = 0, b = 0, lastDev = null, lastEv = -1;
    while (a < ex.length || b < dx.length) {
      if (b >= dx.length || (a < ex.length && ex[a] <= dx[b])) { X.push(ex[a]); lastEv = a++; }
      else { X.push(dx[b]); lastDev = dv[b++]; }
      for (let k = 0; k < K1; k++) out[k].push(lastEv >= 0 ? Y[k][lastEv] : null);
      out[K1].push(lastDev);
    }
    X.push(x1); for (let k = 0; k <= K1; k++) out[k].push(out[k][out[k].length - 1]);
    return { data: [X, ...out], exact: isExact, events: count };
  }

  /* the live set right after event e, from the event arrays: exactly the allocations with i <= e < i + life */
  function liveLocal(R, e) {
    const { act, size, stack, life, path, pre_end, pre_size, pre_path } = R.col, L = R.L, m = R.meta;
    const bytes = new Float64Array(m.paths.length), counts = new Uint32Array(m.paths.length);
    let total = 0, count = 0;
    for (let j = 0; j < pre_end.length; j++) if (pre_end[j] > e) { bytes[pre_path[j]] += pre_size[j]; counts[pre_path[j]]++; total += pre_size[j]; count++; }
    for (let i = 0; i <= e; i++) {
      if (act[i] !== ALLOC || i + life[i] <= e) continue;
      bytes[path[i]] += size[i]; counts[path[i]]++; total += size[i]; count++;
    }
    const groups = [];
    for (let p = 0; p < bytes.length; p++) if (counts[p]) groups.push({ path: m.paths[p].map((l) => m.labels[l]), title: m.path_titles[p], bytes: bytes[p], count: counts[p] });
    groups.sort((x, y) => y.bytes - x.bytes);
    const around = [];
    for (let i = Math.max(0, e - 12); i < Math.min(L.t.length, e + 13); i++) {
      around.push({ index: i, t_us: L.t[i], action: m.actions[act[i]], size: size[i],
        category: R.col.cat[i] >= 0 ? m.categories[R.col.cat[i]] : '', where: stack[i] >= 0 ? m.stack_titles[stack[i]] : '' });
    }
    return { event: e, t_us: e >= 0 ? L.t[e] : m.t_first_us, total, count, groups, around };
  }

  /* ---------- a serving window after start-up: the broken time axis and the parts of a rank ---------- */
  /* doc.x_scale (plots/view_data.py time_axis): the knots of the piecewise-linear map from page microseconds
   * to drawn ones, each gap squeezed as memtrace plot squeezes it; none: a linear axis */
  const XS = doc.x_scale;
  function interp(x, xs, ys) { /* between the knots; the end segments extended */
    const i = Math.max(0, Math.min(xs.length - 2, upper(xs, x) - 1));
    return xs[i + 1] === xs[i] ? ys[i] : ys[i] + ((x - xs[i]) * (ys[i + 1] - ys[i])) / (xs[i + 1] - xs[i]);
  }
  MT.fwd = XS ? (s) => interp(s * 1e6, XS.knots_us, XS.drawn_us) / 1e6 : (s) => s;
  MT.bwd = XS ? (d) => interp(d * 1e6, XS.drawn_us, XS.knots_us) / 1e6 : (d) => d;
  /* the part of rank R that recorded tus: start-up (R), its serving window (R.W), or null in the gap between
   * them (dropped from the ring: not recorded) */
  function partAt(R, tus) {
    if (!R.W) return R;
    const g = R.W.meta.gap;
    return tus <= g.start_us ? R : tus >= g.end_us ? R.W : null;
  }
  /* one part's chart data between x0 and x1 (the model above; the server's; the overview) */
  const partQuery = (P) => (P.part === 'serving' ? '&part=serving' : '');
  function partWindow(P, x0, x1, W) {
    return (P.L ? Promise.resolve(windowLocal(P, x0, x1, W))
      : doc.api && !isOverview(P, x0, x1) ? api(`/api/window?rank=${P.index}${partQuery(P)}&x0=${x0}&x1=${x1}&w=${W}`)
        : Promise.resolve(P.meta.overview)).then((w) => (P.col.vmm_t ? { ...w, data: withVmm(P, w.data) } : w))
      .then((w) => (P.col.oth_t ? { ...w, data: withOthers(P, w.data) } : w));
  }
  /* a rank's chart data: start-up's, then its serving window's, each with the pixels its drawn width gets,
   * joined by one point of nulls in the gap: no curve is drawn across it */
  function rankWindow(R, x0, x1, W) {
    if (!R.W) return partWindow(R, x0, x1, W);
    const g = R.W.meta.gap, a = g.start_us / 1e6, b = g.end_us / 1e6, span = MT.fwd(x1) - MT.fwd(x0);
    const px = (lo, hi) => Math.max(10, Math.round((W * (MT.fwd(hi) - MT.fwd(lo))) / span));
    const parts = [];
    if (x0 < a) parts.push(partWindow(R, x0, Math.min(x1, a), px(x0, Math.min(x1, a))));
    if (x1 > b) parts.push(partWindow(R.W, Math.max(x0, b), x1, px(Math.max(x0, b), x1)));
    return Promise.all(parts).then((ws) => {
      const n = Math.max(R.meta.categories.length + 3, ...ws.map((w) => w.data.length));
      const data = Array.from({ length: n }, () => []), mid = (Math.max(x0, a) + Math.min(x1, b)) / 2;
      const gapPoint = () => { data[0].push(mid); for (let k = 1; k < n; k++) data[k].push(null); };
      ws.forEach((w, i) => {
        if (i) gapPoint();
        const len = w.data[0].length;
        for (let k = 0; k < n; k++) { const c = w.data[k]; for (let j = 0; j < len; j++) data[k].push(c ? c[j] : null); }
      });
      if (!ws.length) data.forEach((c, k) => c.push(k ? null : x0, k ? null : x1)); /* all in the gap */
      return { data, exact: ws.every((w) => w.exact), events: ws.reduce((t, w) => t + w.events, 0) };
    });
  }

  /* ---------- remote answers (memtrace view --serve) ---------- */
  async function api(path) {
    const r = await fetch(path);
    if (!r.ok) throw new Error(path + ': ' + r.status + ' ' + (await r.text()));
    return r.json();
  }

  const isOverview = (R, x0, x1) => {
    const X = R.meta.overview && R.meta.overview.data[0];
    return !!X && (Math.abs(x0 - X[0]) < 1e-9 && Math.abs(x1 - X[X.length - 1]) < 1e-9);
  };
  MT.window = rankWindow;
  /* what was live after event e of part P (start-up or a serving window), and the last event at or before tus */
  MT.live = (P, e) => (P.L ? Promise.resolve(liveLocal(P, e))
    : doc.api ? api(`/api/live?rank=${P.index}${partQuery(P)}&event=${e}`) : Promise.reject(new Error('this page carries an overview only: run `memtrace view --serve RUN` to see what was live')));
  MT.eventAt = (P, tus) => (P.L ? Promise.resolve(upper(P.L.t, tus) - 1)
    : doc.api ? api(`/api/event?rank=${P.index}${partQuery(P)}&t_us=${tus}`).then((d) => d.event) : Promise.resolve(null));

  MT._internals = { buildLocal, windowLocal, liveLocal, stateAt, deviceAt, cuptiAt, vmmAt, withVmm, othersAt, withOthers, phaseAt, partAt, upper, inflate, columns, exact };
  window.__mtDoc = doc;
})();
