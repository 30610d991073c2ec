"""The calling thread's Python stack as (filename, line, name) tuples, innermost first.

Used where memtrace takes a stack itself rather than asking PyTorch for one: CUPTI's allocation
callbacks (:mod:`.cupti`) and vLLM's virtual-memory calls (:mod:`memtrace.plugins.vllm_vmm`). A frame of
``torch/_ops.py`` calling an operator is named with it (``model.op_frame_name``: ``__call__ [op
vllm::moe_forward]``): a C++ op's own allocation has no Python frame below it, so the op is the clue.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection
from typing import Any

#: Innermost frames kept per stack.
MAX_FRAMES = 96
_OPS_FILE = os.path.join("torch", "_ops.py")


def own_file(path: str) -> str:
    """``path`` as :func:`python_frames` compares it (absolute, case-normalised)."""
    return os.path.normcase(os.path.abspath(path))


def python_frames(skip: int = 1, exclude: Collection[str] = ()) -> tuple[tuple[str, int, str], ...]:
    """The stack of the caller's caller (``skip`` frames up), innermost first, frames of the files in
    ``exclude`` (:func:`own_file` spellings: the recorder's own) left out, at most :data:`MAX_FRAMES`."""
    frame = sys._getframe(skip)
    out = []
    while frame is not None and len(out) < MAX_FRAMES:
        code = frame.f_code
        if not exclude or os.path.normcase(code.co_filename) not in exclude:
            name = code.co_name
            if name == "__call__" and code.co_filename.endswith(_OPS_FILE):
                name = _op_name(frame, name)
            out.append((code.co_filename, frame.f_lineno or 0, name))
        frame = frame.f_back
    return tuple(out)


def _op_name(frame: Any, name: str) -> str:
    """``name`` with the operator ``self`` of an ``OpOverload``/``OpOverloadPacket.__call__`` frame."""
    from memtrace.model import (
        op_frame_name,
    )  # here, not at import: the vLLM plugin imports this module when it registers

    try:
        op = frame.f_locals.get("self")
        qualified = getattr(op, "_name", None) or getattr(op, "_qualified_op_name", None)
        return op_frame_name(name, str(qualified)) if qualified else name
    except Exception:  # noqa: BLE001  (a frame we cannot read keeps its plain name)
        return name
