"""A SYNTHETIC ``torch.cuda.memory._dump_snapshot()`` pickle of any size, with torch's object structure.

What a real snapshot holds (checked on the public snapshots in tests/data/snapshots and by
``tests/unit/test_snapshot_gen.py``): one dict per trace entry with keys in torch's order (action,
addr, size, stream, time_us, compile_context, user_metadata, frames); frame dicts
``{name, filename, line}`` shared across the whole snapshot; a *new* frames list per traceback:
an ``alloc`` has its own list, ``free_requested`` and ``free_completed`` of one block share one list
(the free's context), a ``segment_alloc`` shares the list of the ``alloc`` that caused it. The
pickle is what ``pickle.dump`` (protocol 4, torch's default before Python 3.14) writes for that
object graph: every dict, list and string memoized once, shared objects referred to by ``BINGET``,
64 KiB frames, ``APPENDS`` every 1,000 items (one difference: a frame dict or key string is defined
just before the first object that uses it and popped, where ``pickle.dump`` defines it inside that
object; the unpickled graph is the same). It is written as a stream, so ten million entries need
no memory.

The workload is a vLLM-shaped start-up: weights (one 32 MiB segment each), a pool of slots churned
by alloc / free_requested / free_completed, a transient segment every 500 events, ~3,000 distinct
stacks of depth 12-33 (shared outer frames, varied inner ones), record_function phases
(``memtrace:<phase>`` START/END in ``external_annotations``), and a final ``segments`` list that
the history adds up to.

  python tests/bench/snapshot_gen.py 1000000 /tmp/snap-1M.pickle
"""

from __future__ import annotations

import struct
import sys
from typing import IO

import numpy as np

MiB = 1 << 20
T0 = 1_780_000_000_000_000
WEIGHTS = 1_500
SLOTS = 5_000
N_STACKS = 3_000
DEPTH = (12, 33)
FRAME_TARGET = 64 * 1024
PHASES = (
    ("init_device", 0.00, 0.01),
    ("load_model", 0.01, 0.10),
    ("determine_available_memory", 0.10, 0.50),
    ("profile_run", 0.11, 0.48),
    ("initialize_kv_cache", 0.50, 0.53),
    ("compile_or_warm_up_model", 0.53, 1.00),
    ("capture_model", 0.80, 0.99),
)


class _Writer:
    """Pickle opcodes as ``pickle.dump`` (protocol 4) chooses them, framed, memo counted here."""

    def __init__(self, out: IO[bytes]):
        self.out = out
        self.buf: list[bytes] = []
        self.size = 0
        self.memo = 0
        self.strings: dict[str, int] = {}

    def w(self, data: bytes) -> None:
        self.buf.append(data)
        self.size += len(data)

    def boundary(self) -> None:
        """Between two complete objects: commit a frame once it reaches 64 KiB."""
        if self.size >= FRAME_TARGET:
            self.commit()

    def commit(self) -> None:
        if self.size:
            self.out.write(b"\x95" + struct.pack("<Q", self.size) + b"".join(self.buf))
            self.buf.clear()
            self.size = 0

    def memoize(self) -> int:
        self.w(b"\x94")
        self.memo += 1
        return self.memo - 1

    @staticmethod
    def get(idx: int) -> bytes:
        return b"h" + bytes((idx,)) if idx < 256 else b"j" + struct.pack("<I", idx)

    def s(self, text: str) -> bytes:
        """A string: defined (and memoized) the first time, referred to after."""
        idx = self.strings.get(text)
        if idx is not None:
            return self.get(idx)
        data = text.encode()
        self.w(b"\x8c" + bytes((len(data),)) + data if len(data) < 256 else b"X" + struct.pack("<I", len(data)) + data)
        self.strings[text] = self.memoize()
        return b""

    def put_s(self, text: str) -> None:
        self.w(self.s(text))

    @staticmethod
    def i(v: int) -> bytes:
        if 0 <= v < 256:
            return b"K" + bytes((v,))
        if 0 <= v < 65536:
            return b"M" + struct.pack("<H", v)
        if -(1 << 31) <= v < (1 << 31):
            return b"J" + struct.pack("<i", v)
        n = (v.bit_length() + 8) // 8
        return b"\x8a" + bytes((n,)) + v.to_bytes(n, "little", signed=True)


def _stacks(rng: np.random.Generator) -> tuple[list[tuple[str, str, int]], list[tuple[int, ...]]]:
    """Frames (name, filename, line) and stacks (frame ids, innermost first) with shared outer parts."""
    files = [f"/venv/lib/python3.12/site-packages/vllm/model_executor/layers/mod{i}.py" for i in range(300)]
    frames = [(f"fn_{i}", files[i % 300], 10 + (i * 7) % 2000) for i in range(9_000)]
    outers = [tuple(int(x) for x in rng.choice(1_000, 8, replace=False)) for _ in range(60)]
    stacks = []
    for k in range(N_STACKS):
        depth = int(rng.integers(DEPTH[0], DEPTH[1] + 1))
        inner = tuple(int(x) for x in rng.choice(np.arange(1_000, 9_000), depth - 8, replace=False))
        stacks.append(inner + outers[k % len(outers)])
    return frames, stacks


def events(n_events: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Columns of the history: action names' codes, addr, size, time_us, stack, and the final live set."""
    rng = np.random.default_rng(seed)
    churn_events = max(0, n_events - 2 * WEIGHTS - 1) * 500 // 502  # a transient segment adds 2 per 500
    steps = max(SLOTS + 1, (churn_events + 2 * SLOTS) // 3)  # the first SLOTS steps free nothing
    seg_base, slot_base, trans_base = 0x7F00_0000_0000, 0x7E00_0000_0000, 0x7D00_0000_0000
    w = np.arange(WEIGHTS)
    wsize = 32 * MiB - rng.integers(0, 4096, WEIGHTS)
    wstack = rng.integers(0, 50, WEIGHTS)
    head = np.zeros((2 * WEIGHTS + 1, 4), dtype=np.int64)
    head[0:-1:2] = np.stack([np.full(WEIGHTS, 3), seg_base + w * 32 * MiB, np.full(WEIGHTS, 32 * MiB), wstack], 1)
    head[1:-1:2] = np.stack([np.zeros(WEIGHTS), seg_base + w * 32 * MiB, wsize, wstack], 1)
    head[-1] = (3, slot_base, SLOTS * 2 * MiB, 50)
    sizes = rng.integers(512, 2 * MiB, steps)
    slot = np.arange(steps) % SLOTS
    old = np.arange(steps) - SLOTS
    churn = np.zeros((steps, 3, 4), dtype=np.int64)
    churn[:, :, 1] = (slot_base + slot * 2 * MiB)[:, None]
    churn[:, 0, 0], churn[:, 1, 0], churn[:, 2, 0] = 1, 2, 0
    churn[:, 0, 2] = churn[:, 1, 2] = np.where(old >= 0, sizes[np.maximum(old, 0)], 0)
    churn[:, 2, 2] = sizes
    churn[:, 0, 3] = churn[:, 1, 3] = rng.integers(50, N_STACKS, steps)
    astack = rng.integers(50, N_STACKS, steps)
    churn[:, 2, 3] = astack
    churn = churn.reshape(-1, 4)
    churn = churn[~((churn[:, 0] != 0) & (churn[:, 2] == 0))]
    ev = np.concatenate((head, churn))
    n_trans = len(ev) // 500
    trans = np.zeros((2 * n_trans, 4), dtype=np.int64)
    trans[0::2, 0], trans[1::2, 0] = 3, 4
    trans[0::2, 1] = trans[1::2, 1] = trans_base + np.arange(n_trans) * 64 * MiB
    trans[:, 2] = np.repeat(rng.integers(2, 64, n_trans) * 2 * MiB, 2)
    trans[:, 3] = np.repeat(rng.integers(50, N_STACKS, n_trans), 2)
    pos = np.sort(np.concatenate((np.arange(n_trans) * 500 + 10, np.arange(n_trans) * 500 + 60)))
    ev = np.insert(ev, pos, trans, axis=0)
    times = T0 + np.linspace(1_000_000, 299_000_000, len(ev)).astype(np.int64)
    live_churn = np.arange(max(steps - SLOTS, 0), steps)
    return {"ev": ev, "time_us": times, "wsize": wsize, "wstack": wstack, "live": live_churn, "sizes": sizes,
            "astack": astack}  # fmt: skip


ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free")


def write_snapshot(out: IO[bytes], n_events: int, seed: int = 0) -> int:
    """Write the snapshot pickle of about ``n_events`` entries to ``out``; returns the entry count."""
    rng = np.random.default_rng(seed + 1)
    frames, stacks = _stacks(rng)
    cols = events(n_events, seed)
    w = _Writer(out)
    frame_memo: dict[int, int] = {}
    body: dict[int, bytes] = {}

    def stack_body(s: int) -> bytes:
        """MARK frame-refs APPENDS of stack ``s``, defining its frame dicts the first time."""
        b = body.get(s)
        if b is None:
            for fid in stacks[s]:
                if fid not in frame_memo:
                    name, filename, line = frames[fid]
                    w.w(b"}")
                    frame_memo[fid] = w.memoize()
                    w.w(b"(")
                    for key, val in (("name", name), ("filename", filename)):
                        w.put_s(key)
                        w.put_s(val)
                    w.put_s("line")
                    w.w(w.i(line))
                    w.w(b"u")
                    w.w(b"0")  # POP: the dict is defined; lists below refer to it
            b = body[s] = b"(" + b"".join(w.get(frame_memo[f]) for f in stacks[s]) + b"e"
        return b

    w.out.write(b"\x80\x04")
    w.w(b"}")
    w.memoize()
    w.w(b"(")
    # segments first, as torch orders them (written after the entries' stacks are known is not needed:
    # a block gets a new list of its own, as torch converts each block's context separately)
    w.put_s("segments")
    _segments(w, cols, stack_body)
    w.put_s("device_traces")
    w.w(b"]")
    w.memoize()
    w.w(b"]")
    w.memoize()
    n = _entries(w, cols, stack_body)
    w.w(b"a")  # APPEND the one device's list to device_traces
    w.put_s("allocator_settings")
    w.w(b"}")
    w.memoize()
    w.put_s("external_annotations")
    _annotations(w, cols["time_us"])
    w.w(b"u.")
    w.commit()
    return n


def _new_list(w: _Writer, stack_body, s: int) -> int:
    b = stack_body(s)
    w.w(b"]")
    idx = w.memoize()
    w.w(b)
    return idx


def _entries(w: _Writer, cols, stack_body) -> int:
    ev, times = cols["ev"], cols["time_us"]
    keys = ("action", "addr", "size", "stream", "time_us", "compile_context", "user_metadata", "frames")
    for k in (*keys, "N/A", "", *ACTIONS):
        w.put_s(k)
        w.w(b"0")  # defined once, popped (pickle.dump would define them inside the first entry)
    K = {k: w.get(w.strings[k]) for k in (*keys, "N/A", "", *ACTIONS)}
    tail_ctx = K["compile_context"] + K["N/A"] + K["user_metadata"] + K[""] + K["frames"]
    stream0 = K["stream"] + b"K\x00"
    free_list = 0
    seg_list = (-1, -1)  # (memo index, stack) of the last segment_alloc: its alloc shares the list
    w.w(b"(")
    i = w.i
    for lo in range(0, len(ev), 100_000):
        rows = ev[lo : lo + 100_000].tolist()
        ts = times[lo : lo + 100_000].tolist()
        for j, (a, addr, size, s) in enumerate(rows):
            head = b"}\x94(" + K["action"] + K[ACTIONS[a]] + K["addr"] + i(addr) + K["size"] + i(size) + stream0
            w.memo += 1
            w.w(head + K["time_us"] + i(ts[j]) + tail_ctx)
            if a == 2:  # free_completed: the free_requested's list (one context for the free)
                w.w(w.get(free_list) + b"u")
            elif a == 0 and seg_list[1] == s:  # the alloc that made a segment: the segment_alloc's list
                w.w(w.get(seg_list[0]) + b"u")
                seg_list = (-1, -1)
            else:
                idx = _new_list(w, stack_body, s)
                w.w(b"u")
                if a == 1:
                    free_list = idx
                elif a == 3:
                    seg_list = (idx, s)
            if j % 1000 == 999:
                w.w(b"e(")
                w.boundary()
    w.w(b"e")
    return len(ev)


def _segments(w: _Writer, cols, stack_body) -> None:
    seg_base, slot_base = 0x7F00_0000_0000, 0x7E00_0000_0000
    segs = [(seg_base + k * 32 * MiB, 32 * MiB, [(seg_base + k * 32 * MiB, 32 * MiB, int(cols["wsize"][k]),
             int(cols["wstack"][k]))]) for k in range(WEIGHTS)]  # fmt: skip
    blocks = []
    for k in cols["live"].tolist():
        blocks.append((slot_base + (k % SLOTS) * 2 * MiB, 2 * MiB, int(cols["sizes"][k]), int(cols["astack"][k])))
    blocks.sort()
    cursor, pool = slot_base, []
    for b in blocks:  # inactive blocks fill the gaps, as torch's segments cover every byte
        if b[0] > cursor:
            pool.append((cursor, b[0] - cursor, 0, -1))
        pool.append(b)
        cursor = b[0] + b[1]
    if cursor < slot_base + SLOTS * 2 * MiB:
        pool.append((cursor, slot_base + SLOTS * 2 * MiB - cursor, 0, -1))
    segs.append((slot_base, SLOTS * 2 * MiB, pool))
    w.w(b"]")
    w.memoize()
    w.w(b"(")
    for addr, total, blks in segs:
        alloc = sum(b[1] for b in blks if b[3] >= 0)
        req = sum(b[2] for b in blks if b[3] >= 0)
        w.w(b"}")
        w.memoize()
        w.w(b"(")
        for k, v in (("device", 0), ("address", addr), ("total_size", total), ("allocated_size", alloc),
                     ("active_size", alloc), ("requested_size", req), ("stream", 0)):  # fmt: skip
            w.put_s(k)
            w.w(w.i(v))
        w.put_s("segment_type")
        w.put_s("large")
        w.put_s("segment_pool_id")
        w.w(b"K\x00K\x00\x86")
        w.memoize()
        w.put_s("is_expandable")
        w.w(b"\x89")
        w.put_s("blocks")
        w.w(b"]")
        w.memoize()
        w.w(b"(")
        for baddr, bsize, breq, bstack in blks:
            w.w(b"}")
            w.memoize()
            w.w(b"(")
            for k, v in (("address", baddr), ("size", bsize), ("requested_size", breq)):
                w.put_s(k)
                w.w(w.i(v))
            w.put_s("state")
            w.put_s("active_allocated" if bstack >= 0 else "inactive")
            w.put_s("frames")
            if bstack >= 0:
                _new_list(w, stack_body, bstack)
            else:
                w.w(b"]")
                w.memoize()
            w.w(b"u")
        w.w(b"eu")
        w.boundary()
    w.w(b"e")


def _annotations(w: _Writer, times: np.ndarray) -> None:
    t0, t1 = int(times[0]), int(times[-1])
    marks = []
    for name, a, b in PHASES:
        marks.append((t0 + int((t1 - t0) * a), "START", name))
        marks.append((t0 + int((t1 - t0) * b), "END", name))
    marks.sort(key=lambda m: (m[0], m[1] == "START"))
    w.w(b"]")
    w.memoize()
    w.w(b"(")
    for t, stage, name in marks:
        w.w(b"}")
        w.memoize()
        w.w(b"(")
        for k, v in (("name", f"memtrace:{name}"), ("stage", stage)):
            w.put_s(k)
            w.put_s(v)
        w.put_s("device")
        w.w(b"K\x00")
        w.put_s("time_us")
        w.w(w.i(t))
        w.w(b"u")
    w.w(b"e")


if __name__ == "__main__":
    n = int(float(sys.argv[1]))
    with open(sys.argv[2], "wb") as f:
        print(f"{write_snapshot(f, n):,} entries written to {sys.argv[2]}")
