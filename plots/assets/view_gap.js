/* memtrace view: the serving window's gap on the page (a rank whose trace holds a serving window, trace format
 * 1.4). Between start-up's end and the window's first kept record the ring dropped what it could not keep:
 * the chart squeezes that time (doc.x_scale, as memtrace plot does), covers it with an opaque hatched band
 * that says its length and what was dropped, draws no curve across it, and a click there says it was not
 * recorded. Used by view_ui.js through memtraceView._gap. */
(function () {
  'use strict';
  const MT = window.memtraceView, doc = window.__mtDoc;
  const n = (v) => Number(v).toLocaleString('en-US');
  const secs = (us) => (us / 1e6).toFixed(3) + ' s';

  /* ticks of the broken axis: round values in each recorded stretch, as many as its drawn width holds, none
   * inside a gap and none closer than 60 px to the previous one (plots/timeline_scale.py ticks) */
  const decimals = new Map();
  function ticks(u, min, max) {
    const W = u.bbox.width / (devicePixelRatio || 1), span = MT.fwd(max) - MT.fwd(min), out = [];
    const stretches = [];
    let lo = min, lastPx = -Infinity;
    for (const [ga, gb] of doc.x_scale.gaps_us) {
      if (ga / 1e6 > lo) stretches.push([lo, Math.min(ga / 1e6, max)]);
      lo = Math.max(lo, gb / 1e6);
    }
    if (max > lo) stretches.push([lo, max]);
    for (const [a, b] of stretches) {
      const px = (W * (MT.fwd(b) - MT.fwd(a))) / span, count = Math.floor(px / 90);
      if (!(b > a) || count < 1) continue;
      const raw = (b - a) / count, p = Math.pow(10, Math.floor(Math.log10(raw)));
      const incr = [1, 2, 5, 10].map((k) => k * p).find((v) => v >= raw * (1 - 1e-9));
      const dec = Math.min(6, Math.max(0, -Math.floor(Math.log10(incr) + 1e-9)));
      for (let k = Math.ceil(a / incr - 1e-9); k * incr <= b + 1e-12; k++) {
        const v = +(k * incr).toFixed(dec), x = (W * (MT.fwd(v) - MT.fwd(min))) / span;
        if (x - lastPx < 60) continue;
        out.push(v); decimals.set(v, dec); lastPx = x;
      }
    }
    return out;
  }
  const tickValues = (u, vs) => vs.map((v) => (v == null ? '' : v.toFixed(decimals.get(v) ?? 3)));

  /* the band over the gap, across the plot's height: opaque (nothing of either side shows through), hatched,
   * its words (plots/serving_text.py gap_label) written across it as memtrace plot writes them */
  let hatch = null;
  function band(R, u, ctx, X, dpr) {
    const g = R.W.meta.gap, EDGE = g.edge /* plots/timeline_breaks.py GAP_EDGE */, top = u.bbox.top, h = u.bbox.height, left = u.bbox.left, w = u.bbox.width;
    const a = Math.max(X(g.start_us), left), b = Math.min(X(g.end_us), left + w);
    if (!(b > a)) return null;
    if (!hatch) {
      const c = document.createElement('canvas'), s = 8 * dpr, x = c.getContext('2d');
      c.width = c.height = s; x.strokeStyle = EDGE; x.lineWidth = dpr;
      x.beginPath(); x.moveTo(0, 0); x.lineTo(s, s); x.moveTo(s, 0); x.lineTo(0, s); x.stroke();
      hatch = ctx.createPattern(c, 'repeat');
    }
    ctx.fillStyle = '#fff'; ctx.fillRect(a, top, b - a, h);
    ctx.fillStyle = hatch; ctx.fillRect(a, top, b - a, h);
    ctx.strokeStyle = EDGE; ctx.lineWidth = dpr; ctx.setLineDash([]); ctx.strokeRect(a, top, b - a, h);
    ctx.save();
    ctx.translate((a + b) / 2, top + h / 2); ctx.rotate(-Math.PI / 2);
    ctx.font = `${10 * dpr}px sans-serif`; ctx.textAlign = 'center'; ctx.textBaseline = 'middle';
    const lines = g.label, lh = 12 * dpr, tw = Math.max(...lines.map((l) => ctx.measureText(l).width));
    ctx.fillStyle = '#fff'; ctx.fillRect(-tw / 2 - 3 * dpr, (-lines.length * lh) / 2 - 2 * dpr, tw + 6 * dpr, lines.length * lh + 4 * dpr);
    ctx.fillStyle = '#333';
    lines.forEach((l, i) => ctx.fillText(l, 0, (i - (lines.length - 1) / 2) * lh));
    ctx.restore();
    return { x0: Math.round(a / dpr), x1: Math.round(b / dpr), label: lines.join('\n') };
  }

  /* a click in the gap: nothing was kept of that time, so nothing is listed as live then */
  function panel(R, tus, el) {
    const g = R.W.meta.gap;
    return [el('h3', {}, `${R.meta.label}: ${secs(tus)} lies in the gap after start-up: not recorded`),
      el('p', { class: 'mt-gap-line', id: `mt-gap-${R.index}` },
        `Between start-up's end (${secs(g.start_us)}) and the serving window's first kept record (${secs(g.end_us)}) ` +
        `the ring dropped ${n(g.events_dropped)} allocator events, ${n(g.samples_dropped)} NVML samples and ` +
        `${n(g.steps_dropped)} scheduler steps: what was live then is unknown, not the memory at either edge.`)];
  }
  const hoverRows = () => [['phase', 'gap after start-up'], ['memory', 'not recorded (dropped from the serving ring)']];

  MT._gap = { ticks, tickValues, band, panel, hoverRows };
})();
