"""Cut a torch.profiler (Kineto) trace down to what memtrace reads, faithfully: every instant event (``[memory]`` and the two others), the
process/thread metadata (``ph: M``), the profiler's own ``Trace`` span, the range that starts first and the one that ends last (the window memtrace reads) and the header
(``schemaVersion``, ``deviceProperties``...), as they are; the operator, kernel and runtime ranges left out.

Used for ``kineto-1.9-sizes-only.pt.trace.json.gz`` (pytorch/kineto, tb_plugin/samples/resnet50_num_workers_0/
worker0.1623143089861.pt.trace.json.gz: 1,159,569 B, 75,718 events; its ranges are ``Operator``/``Runtime``/
``Kernel`` categories of PyTorch 1.9, which memtrace does not read as stacks, so leaving them out changes
nothing memtrace shows).

  python tests/data/snapshots/recipes/cut_kineto_trace.py IN.pt.trace.json.gz OUT.pt.trace.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys


def cut(doc: dict) -> dict:
    events = doc["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    first = min(spans, key=lambda e: e["ts"], default=None)  # the window memtrace reads: the first start...
    last = max(spans, key=lambda e: e["ts"] + e.get("dur", 0), default=None)  # ...and the last end
    kept = [e for e in events if e.get("ph") in ("i", "M") or e.get("cat") == "Trace" or e is first or e is last]
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": kept}


def main(src: str, dst: str) -> None:
    with gzip.open(src, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    with gzip.GzipFile(dst, "wb", compresslevel=9, mtime=0) as f:
        f.write(json.dumps(cut(doc), separators=(",", ":")).encode())


if __name__ == "__main__":
    main(*sys.argv[1:3])
