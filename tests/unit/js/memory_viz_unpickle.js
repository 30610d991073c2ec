// The opcode table of PyTorch's MemoryViz.js unpickle() (torch/utils/viz/MemoryViz.js), re-implemented
// to check that memtrace's streamed memory-viz export uses no opcode the browser viewer cannot read.
// Prints a JSON summary of the snapshot. Usage: node memory_viz_unpickle.js FILE
const fs = require('fs');
const buf = fs.readFileSync(process.argv[2]);
const b = new Uint8Array(buf.buffer, buf.byteOffset, buf.length);
const dec = new TextDecoder();
let off = 0, memo = [], memoId = 0, stack = [], marks = [];
const u4 = () => { const n = b[off] + b[off+1]*256 + b[off+2]*65536 + b[off+3]*16777216; off += 4; return n; };
const dv = new DataView(buf.buffer, buf.byteOffset, buf.length);
function run() {
  for (;;) {
    const op = b[off++];
    switch (op) {
      case 0x80: { const v = b[off++]; if (v < 2 || v > 4) throw new Error('version ' + v); break; }
      case 0x61: { const v = stack.pop(); stack.at(-1).push(v); break; }
      case 0x65: { const m = marks.pop(); const a = stack[m-1]; a.push(...stack.splice(m, Infinity)); break; }
      case 0x74: case 0x6c: { const m = marks.pop(); stack.push([...stack.splice(m, Infinity)]); break; }
      case 0x89: stack.push(false); break;
      case 0x88: stack.push(true); break;
      case 0x4e: stack.push(null); break;
      case 0x68: stack.push(memo[b[off++]]); break;
      case 0x4a: stack.push(dv.getInt32(off, true)); off += 4; break;
      case 0x4b: stack.push(b[off++]); break;
      case 0x4d: stack.push(b[off] + b[off+1]*256); off += 2; break;
      case 0x7d: stack.push({}); break;
      case 0x5d: stack.push([]); break;
      case 0x95: off += 8; break;
      case 0x8a: { const s = b[off++]; if (s > 8) throw new Error('big long'); let v = 0n; for (let i = s-1; i >= 0; i--) v = (v << 8n) | BigInt(b[off+i]); if (s && b[off+s-1] >= 128) v -= 1n << BigInt(8*s); off += s; stack.push(Number(v)); break; }
      case 0x6a: stack.push(memo[u4()]); break;
      case 0x28: marks.push(stack.length); break;
      case 0x94: memo[memoId++] = stack.at(-1); break;
      case 0x71: memo[b[off++]] = stack.at(-1); break;
      case 0x72: memo[u4()] = stack.at(-1); break;
      case 0x75: { const m = marks.pop(); const d = stack[m-1]; for (let i = m; i < stack.length; i += 2) d[stack[i]] = stack[i+1]; stack.splice(m, Infinity); break; }
      case 0x8c: { const n = b[off++]; stack.push(dec.decode(b.subarray(off, off+n))); off += n; break; }
      case 0x58: { const n = u4(); stack.push(dec.decode(b.subarray(off, off+n))); off += n; break; }
      case 0x2e: return stack.pop();
      case 0x29: stack.push([]); break;
      case 0x85: stack.push([stack.pop()]); break;
      case 0x86: stack.push(stack.splice(-2, Infinity)); break;
      case 0x87: stack.push(stack.splice(-3, Infinity)); break;
      case 0x47: stack.push(dv.getFloat64(off, false)); off += 8; break;
      default: throw new Error('UNKNOWN OPCODE: ' + op + ' at ' + (off-1));
    }
  }
}
const snap = run();
const dev = snap.device_traces.findIndex(t => t.length > 0);
const tr = snap.device_traces[dev];
let alloc = 0, peak = 0;
for (const e of tr) { if (e.action === 'alloc') alloc += e.size; if (e.action === 'free_completed') alloc -= e.size; }
const oom = tr.find(e => e.action === 'oom');
console.log(JSON.stringify({keys: Object.keys(snap), device: dev, entries: tr.length, segments: snap.segments.length,
  first: {action: tr[0].action, addr: tr[0].addr, frames: tr[0].frames.length, frame0: tr[0].frames[0]},
  net_alloc: alloc, oom: oom ? {size: oom.size, device_free: oom.device_free} : null}));
