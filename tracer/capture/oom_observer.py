"""Write the trace when the CUDA caching allocator runs out of memory, before the error propagates.

``torch._C._cuda_attach_out_of_memory_observer(fn)`` calls ``fn(device, requested_bytes,
device_total_bytes, device_free_bytes)`` inside the failing allocation (after cached blocks were
released, with the allocator lock dropped) and before ``torch.OutOfMemoryError`` is raised. The
observer records ``facts["oom"]`` (with the phase path at that moment), drains the history and
saves the segments, so the trace on disk is complete even if the process dies right after.
Observers cannot be detached: one trampoline is attached per process and forwards to the active
session, if any.
"""

from __future__ import annotations

import logging

log = logging.getLogger("memtrace")

_attached = False


def _observer(device: int, requested: int, total: int, free: int) -> None:
    from memtrace.capture.registry import active_session

    session = active_session()
    if session is None:
        return
    try:
        session.on_oom(int(device), int(requested), int(total), int(free))
    except Exception as exc:  # the program's own OOM error must still be the one it sees
        log.warning("memtrace: could not write the trace at the CUDA OOM: %s", exc)


def attach() -> bool:
    """Attach the OOM observer once per process; False if this torch has no observer hook."""
    global _attached
    if _attached:
        return True
    import torch

    hook = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if hook is None:
        log.warning("memtrace: this torch has no OOM observer; an OOM is recorded only by the allocator history")
        return False
    hook(_observer)
    _attached = True
    return True
