"""How a recorded frame is named on screen: ``pkg/module.py:123 function``, or a native stack's C++ name."""

from __future__ import annotations

from memtrace.analysis.holders.frames import native_name
from memtrace.model import Frame, is_native_frame


def frame_text(frame: Frame | None) -> str:
    """``pkg/module.py:123 function``: the path after site-packages (or its last two parts)."""
    if frame is None:
        return "(no stack recorded)"
    if is_native_frame(frame):  # a stack with no Python frame (an autograd engine thread)
        return f"{native_name(frame.name)} (C++; no Python frame)"
    fn = frame.filename.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in fn:
            fn = fn.split(marker, 1)[1]
            break
    else:
        fn = "/".join(fn.split("/")[-2:])
    return f"{fn}:{frame.line} {frame.name}"
