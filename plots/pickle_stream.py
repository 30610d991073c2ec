"""Write a ``_snapshot()``-shaped pickle straight to a file, ten million trace entries at numpy speed.

``pickle.dump`` of a snapshot dict needs the whole dict in memory first (tens of GiB of Python
objects at ten million entries) and memoizes every entry dict. This writer emits the pickle opcodes
itself, for the few types a snapshot holds, and writes the allocator events in fixed-size records
built with numpy:

- strings, frame dicts and frames lists are written once and memoized (``MEMOIZE``, then
  ``LONG_BINGET``), so every entry refers to its stack as torch's own pickles do;
- an entry is ``EMPTY_DICT MARK key value ... SETITEMS`` with every key and action a memo
  reference and every integer a ``LONG1`` of 8 bytes: 103 bytes, the same for every entry, so a
  chunk of entries is one numpy array of bytes;
- an entry that is the first to use a stack or an action, and every ``oom`` entry (it also carries
  ``device_free``), goes through the generic writer, which memoizes what it meets.

Only opcodes that PyTorch's MemoryViz.js unpickler reads are used (PROTO 4, EMPTY_DICT/LIST/TUPLE,
MARK, SETITEMS, APPENDS, TUPLE1-3, TUPLE, MEMOIZE, LONG_BINGET, SHORT_BINUNICODE, BINUNICODE,
BININT1, BININT, LONG1, BINFLOAT, NONE, NEWTRUE, NEWFALSE, STOP); no FRAME (optional in protocol 4).
"""

from __future__ import annotations

import struct
from typing import IO, Any

import numpy as np

PROTO4 = b"\x80\x04"
EMPTY_DICT, EMPTY_LIST, EMPTY_TUPLE = b"}", b"]", b")"
MARK, SETITEMS, APPENDS, TUPLE, STOP = b"(", b"u", b"e", b"t", b"."
MEMOIZE, LONG_BINGET = b"\x94", b"j"
SHORT_BINUNICODE, BINUNICODE = b"\x8c", b"X"
BININT1, BININT, LONG1, BINFLOAT = b"K", b"J", b"\x8a", b"G"
NONE, NEWTRUE, NEWFALSE = b"N", b"\x88", b"\x89"
TUPLES = {1: b"\x85", 2: b"\x86", 3: b"\x87"}


class StackRef:
    """Stands for the frames list of interned stack ``stack`` (-1: no frames) in data given to
    :class:`PickleStream`, which writes each stack's list once and refers to it afterwards."""

    __slots__ = ("stack",)

    def __init__(self, stack: int) -> None:
        self.stack = int(stack)


class PickleStream:
    """A protocol-4 pickle written piece by piece to ``out``, with its own memo.

    ``frames[i]`` is frame ``i`` as (filename, line, name); ``stacks[s]`` the frame ids of stack ``s``.
    """

    def __init__(self, out: IO[bytes], frames: list[tuple[str, int, str]], stacks: list[tuple[int, ...]]):
        self.out = out
        self.frames = frames
        self.stacks = stacks
        self.n_memo = 0
        self.strings: dict[str, int] = {}
        self.frame_memo: dict[int, int] = {}
        self.stack_memo: dict[int, int] = {}
        self.parts: list[bytes] = []

    # -- low level -------------------------------------------------------------------------------
    def w(self, data: bytes) -> None:
        self.parts.append(data)
        if len(self.parts) > 4096:
            self.flush()

    def raw(self, data: bytes) -> None:
        """Write pickled bytes made elsewhere (after everything written so far)."""
        self.flush()
        self.out.write(data)

    def flush(self) -> None:
        self.out.write(b"".join(self.parts))
        self.parts.clear()

    def _memoize(self) -> int:
        self.w(MEMOIZE)
        self.n_memo += 1
        return self.n_memo - 1

    def get(self, idx: int) -> None:
        self.w(LONG_BINGET + struct.pack("<I", idx))

    # -- values ------------------------------------------------------------------------------------
    def string(self, s: str) -> int:
        """Write ``s`` (memoized: written once, referred to after); returns its memo index."""
        idx = self.strings.get(s)
        if idx is not None:
            self.get(idx)
            return idx
        data = s.encode("utf-8", "surrogatepass")
        if len(data) < 256:
            self.w(SHORT_BINUNICODE + bytes((len(data),)) + data)
        else:
            self.w(BINUNICODE + struct.pack("<I", len(data)) + data)
        idx = self.strings[s] = self._memoize()
        return idx

    def integer(self, v: int) -> None:
        if 0 <= v < 256:
            self.w(BININT1 + bytes((v,)))
        elif -(1 << 31) <= v < (1 << 31):
            self.w(BININT + struct.pack("<i", v))
        else:
            n = (v.bit_length() + 8) // 8
            self.w(LONG1 + bytes((n,)) + v.to_bytes(n, "little", signed=True))

    def frames_list(self, stack: int) -> int:
        """The frames list of ``stack`` (each written once, frame dicts shared); its memo index."""
        idx = self.stack_memo.get(stack)
        if idx is not None:
            self.get(idx)
            return idx
        self.w(EMPTY_LIST)
        idx = self.stack_memo[stack] = self._memoize()
        ids = self.stacks[stack] if stack >= 0 else ()
        if ids:
            self.w(MARK)
            for fid in ids:
                self._frame(fid)
            self.w(APPENDS)
        return idx

    def _frame(self, fid: int) -> None:
        idx = self.frame_memo.get(fid)
        if idx is not None:
            self.get(idx)
            return
        filename, line, name = self.frames[fid]
        self.w(EMPTY_DICT)
        self.frame_memo[fid] = self._memoize()
        self.w(MARK)
        self.string("filename")
        self.string(filename)
        self.string("line")
        self.integer(line)
        self.string("name")
        self.string(name)
        self.w(SETITEMS)

    def value(self, v: Any) -> None:
        """Write a value of the types a snapshot holds (``StackRef`` for a frames list)."""
        if isinstance(v, StackRef):
            self.frames_list(v.stack)
        elif v is None:
            self.w(NONE)
        elif v is True or v is False:
            self.w(NEWTRUE if v else NEWFALSE)
        elif isinstance(v, int):
            self.integer(int(v))
        elif isinstance(v, float):
            self.w(BINFLOAT + struct.pack(">d", v))
        elif isinstance(v, str):
            self.string(v)
        elif isinstance(v, dict):
            self.w(EMPTY_DICT)
            if v:
                self.w(MARK)
                for k, x in v.items():
                    self.value(k)
                    self.value(x)
                self.w(SETITEMS)
        elif isinstance(v, list):
            self.w(EMPTY_LIST)
            if v:
                self.w(MARK)
                for x in v:
                    self.value(x)
                self.w(APPENDS)
        elif isinstance(v, tuple):
            if not v:
                self.w(EMPTY_TUPLE)
                return
            if len(v) <= 3:
                for x in v:
                    self.value(x)
                self.w(TUPLES[len(v)])
                return
            self.w(MARK)
            for x in v:
                self.value(x)
            self.w(TUPLE)
        else:
            raise TypeError(f"cannot write a {type(v).__name__} into a snapshot pickle")


#: The keys of a trace entry, in the order they are written.
ENTRY_KEYS = ("action", "addr", "size", "stream", "time_us", "frames", "compile_context", "user_metadata")
#: Constant values of the last two keys.
COMPILE_CONTEXT, USER_METADATA = "N/A", ""
_INT_KEYS = ("addr", "size", "stream", "time_us")


def _layout() -> tuple[int, dict[str, int]]:
    """Record size and the offset of each variable field: ``}( k v k v ... u``."""
    offsets: dict[str, int] = {}
    pos = 2  # EMPTY_DICT MARK
    for key in ENTRY_KEYS:
        pos += 5  # the key: LONG_BINGET + u32
        offsets[key] = pos
        pos += 10 if key in _INT_KEYS else 5  # LONG1 8 + 8 bytes, or LONG_BINGET + u32
    return pos + 1, offsets  # SETITEMS


RECORD, OFFSETS = _layout()


def entry_records(ps: PickleStream, events: np.ndarray, actions: tuple[str, ...]) -> np.ndarray:
    """Fixed-size pickled entries of ``events`` (every action, key and stack already memoized)."""
    n = len(events)
    rec = np.zeros((n, RECORD), dtype=np.uint8)
    rec[:, 0] = ord(EMPTY_DICT)
    rec[:, 1] = ord(MARK)
    rec[:, -1] = ord(SETITEMS)
    action_idx = np.array([ps.strings.get(a, 0) for a in actions], dtype="<u4")
    stack_idx = np.zeros(len(ps.stacks) + 1, dtype="<u4")
    for s, idx in ps.stack_memo.items():
        stack_idx[s + 1] = idx
    pos = 2
    for key in ENTRY_KEYS:
        rec[:, pos] = ord(LONG_BINGET)
        rec[:, pos + 1 : pos + 5] = np.frombuffer(struct.pack("<I", ps.strings[key]), dtype=np.uint8)
        off = OFFSETS[key]
        if key in _INT_KEYS:
            rec[:, off] = ord(LONG1)
            rec[:, off + 1] = 8
            rec[:, off + 2 : off + 10] = events[key].astype("<i8").view(np.uint8).reshape(n, 8)
        else:
            rec[:, off] = ord(LONG_BINGET)
            if key == "action":
                ref = action_idx[events["action"].astype(np.int64)]
            elif key == "frames":
                ref = stack_idx[events["stack"].astype(np.int64) + 1]
            else:
                ref = np.full(n, ps.strings[COMPILE_CONTEXT if key == "compile_context" else USER_METADATA], "<u4")
            rec[:, off + 1 : off + 5] = ref.astype("<u4").view(np.uint8).reshape(n, 4)
        pos = off + (10 if key in _INT_KEYS else 5)
    return rec
