/* memtrace view: sizes as every other output prints them. tracer/units.py owns the rule and this is its one
 * port (tests/unit/test_view_units_js.py holds the two to the same text on a list of byte values): GiB with
 * two decimals; a figure that is not zero yet would read 0.00 GiB prints in the largest binary unit that keeps
 * it >= 1 ("9.24 KiB", "4 B"). Loaded first in the page (window.memtraceUnits), and by node in the test. */
(function (root) {
  'use strict';
  const KiB = 1024, MiB = 1024 ** 2, GiB = 1024 ** 3, TiB = 1024 ** 4;
  const SCALES = [['TiB', TiB], ['GiB', GiB], ['MiB', MiB], ['KiB', KiB]];
  /* Python's format(x, '.{d}f'): the nearest decimal to x's exact value, a tie to the even digit (JavaScript's
   * toFixed breaks a tie upwards: 0.125 GiB would read 0.13 here and 0.12 in the report) */
  function fixed(x, d) {
    const s = x * 10 ** d;
    if (Math.abs(s % 1) !== 0.5) return x.toFixed(d);
    const n = Math.floor(s);
    return ((n % 2 === 0 ? n : n + 1) / 10 ** d).toFixed(d);
  }
  /* units.format_bytes */
  function formatBytes(b, digits = 1) {
    const sign = b < 0 ? '-' : '', n = Math.abs(b);
    for (const [unit, scale] of SCALES) if (n >= scale) return `${sign}${fixed(n / scale, digits)} ${unit}`;
    return `${sign}${Math.trunc(n)} B`;
  }
  /* units._gib: signed "+0.12"; unit '' for a column headed GiB */
  function gib(b, digits = 2, signed = false, unit = ' GiB') {
    const text = (signed && b >= 0 ? '+' : '') + fixed(b / GiB, digits);
    if (b && !parseFloat(text)) return (signed && b > 0 ? '+' : '') + formatBytes(b, digits);
    return text + unit;
  }
  /* units._size_unit: the largest unit n (>= 0) is *more* than, as c10's format_size picks it; B below */
  function sizeUnit(n) {
    for (const [unit, scale] of SCALES.slice(1)) if (n > scale) return [unit, scale];
    return ['B', 1];
  }
  const U = {
    formatBytes,
    formatGib: (b, digits = 2) => (b == null ? '—' : gib(b, digits)), /* units.format_gib */
    gibNumber: (b) => (b == null ? '-' : gib(b, 2, false, '')), /* units.gib_number */
    signedGib: (b) => gib(b, 2, true), /* units.signed_gib */
    /* units.format_size: torch's c10 rule, two decimals of the largest unit the size is *more* than ("1024.00 MiB") */
    formatSize(b) {
      if (b == null) return '—';
      const sign = b < 0 ? '-' : '', n = Math.abs(b), [unit, scale] = sizeUnit(n);
      return scale === 1 ? `${sign}${Math.trunc(n)} B` : `${sign}${fixed(n / scale, 2)} ${unit}`;
    },
    /* units.axis_unit: the unit of a chart's size axis up to maxBytes, the largest it is more than (GiB for a
     * start-up, KiB for a CPU profiler trace's curves); GiB for an empty chart */
    axisUnit: (maxBytes) => (maxBytes ? sizeUnit(Math.abs(maxBytes)) : ['GiB', GiB]),
  };
  if (typeof module !== 'undefined' && module.exports) module.exports = U;
  else root.memtraceUnits = U;
})(typeof window !== 'undefined' ? window : globalThis);
