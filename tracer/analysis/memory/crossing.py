"""The first crossing of the target: one definition for every output (report, timeline, issue, view).

Definitions (bytes and Unix-epoch microseconds):

- An **excursion** of a curve is a stretch where it is strictly above the target. The *first*
  excursion starts at ``time_us`` (the first step above the target) with the value ``at_cross_bytes``;
  its **duration** is taken over that excursion, until the curve drops back to or below the target, the
  recording ends, or the run died of OOM (``until``: "dropped", "end" or "oom"). The **highest** point
  (``max_bytes``, first reached at ``max_us``) is the highest of *all* the excursions (``excursions``
  counts them): a curve that crossed, dropped back and went higher later is said at its highest.
  ``ended_above``: the curve was above the target where the reading stopped (the recording's end or the
  OOM), in whichever excursion.
- **Nothing after an OOM is claimed**: when the trace recorded an OOM (``analysis.oom.find_oom``),
  the curves are read up to the OOM's moment only. An excursion still above the target then lasts
  "until the OOM"; one that would start after it does not exist.
- **The curve named** is NVML device used when the trace sampled it and it crossed (that is what the
  card sees: CUDA context and non-PyTorch memory included), else PyTorch reserved. The exact reserved
  crossing, when there is one, is kept beside it (:attr:`Crossings.reserved`) as the second line
  every output prints. Device used is sampled, so it may cross a few milliseconds after reserved;
  the earliest curve is *not* what picks the name, so a different ``--target`` never changes which
  curve a report talks about.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memtrace.analysis.memory.curves import Curve, Curves
from memtrace.analysis.memory.phases import path_at, recording_span
from memtrace.analysis.memory.quantities import first_max
from memtrace.model import Trace

DEVICE_USED = "device_used"
RESERVED = "reserved"
#: How each curve is called on screen.
CURVE_NAMES = {DEVICE_USED: "NVML device used", RESERVED: "PyTorch reserved"}


@dataclass(frozen=True)
class Excursion:
    """The first excursion of one curve above the target (see the module docstring)."""

    curve: str  # DEVICE_USED or RESERVED
    target_bytes: int
    time_us: int  # the first moment above the target
    phase_path: str  # the innermost phase in force then ("" outside any phase)
    at_cross_bytes: int  # the curve's value at time_us
    max_bytes: int  # the highest of all the excursions
    max_us: int  # when that highest was first reached
    max_phase_path: str
    duration_us: int  # the first excursion's: until it dropped back, the recording ended, or the OOM
    until: str  # "dropped", "end" or "oom"
    excursions: int  # separate excursions above the target (up to the end or the OOM)
    ended_above: bool = False  # above the target where the reading stopped (the end or the OOM)

    @property
    def overshoot_bytes(self) -> int:
        """How far the excursion's maximum went above the target."""
        return self.max_bytes - self.target_bytes

    @property
    def name(self) -> str:
        return CURVE_NAMES[self.curve]


@dataclass(frozen=True)
class Crossings:
    """Both curves' first excursions over one target, and the one every output names first."""

    target_bytes: int
    device_used: Excursion | None  # None when not sampled or never above
    reserved: Excursion | None
    oom_us: int | None  # the curves were read up to here (None: to the end of the recording)
    reserved_max_bytes: int = 0  # PyTorch reserved's highest over what was read (for "stayed below it")

    @property
    def first(self) -> Excursion | None:
        """The crossing outputs name: device used when it crossed, else reserved (module docstring)."""
        return self.device_used or self.reserved

    @property
    def second(self) -> Excursion | None:
        """The other curve's crossing, when both crossed (the exact reserved one under device used)."""
        return self.reserved if self.device_used is not None else None


def excursion(
    trace: Trace, curve: Curve, target_bytes: int, name: str, *, end_us: int | None = None
) -> Excursion | None:
    """The first excursion of ``curve`` (``name``: DEVICE_USED or RESERVED) above ``target_bytes``, reading its
    steps up to ``end_us`` (an OOM; None: the whole curve)."""
    rec_end = recording_span(trace)[1]
    n = len(curve) if end_us is None else int(np.searchsorted(curve.time_us, end_us, side="right"))
    if n == 0:
        return None
    values, times = curve.bytes[:n], curve.time_us[:n]
    above = values > target_bytes
    if not above.any():
        return None
    i = first_max(above)
    back = np.flatnonzero(~above[i:])
    j = i + int(back[0]) if len(back) else n
    k = i + first_max(values[i:n])  # above the target by construction: values[i] already is
    t = int(times[i])
    if j < n:
        stop, until = int(times[j]), "dropped"
    elif end_us is not None:
        stop, until = int(end_us), "oom"
    else:
        stop, until = max(rec_end, t), "end"
    rises = int(above[0]) + int(np.count_nonzero(above[1:] & ~above[:-1]))
    return Excursion(
        curve=name,
        target_bytes=int(target_bytes),
        time_us=t,
        phase_path=path_at(trace, t),
        at_cross_bytes=int(values[i]),
        max_bytes=int(values[k]),
        max_us=int(times[k]),
        max_phase_path=path_at(trace, int(times[k])),
        duration_us=stop - t,
        until=until,
        excursions=rises,
        ended_above=bool(above[-1]),
    )


def crossings(trace: Trace, curves: Curves, target_bytes: int | None, *, oom_us: int | None = None) -> Crossings | None:
    """Both curves' first excursions above ``target_bytes`` (``resolve_target(...).target_bytes``; None when there
    is no target), nothing read after ``oom_us`` (``find_oom(trace).time_us``)."""
    if target_bytes is None:
        return None
    dev = excursion(trace, curves.device_used, target_bytes, DEVICE_USED, end_us=oom_us) if curves.has_device else None
    res = excursion(trace, curves.reserved, target_bytes, RESERVED, end_us=oom_us)
    start_us, end_us = recording_span(trace)
    top = curves.reserved.window(start_us, oom_us if oom_us is not None else end_us).peak_bytes
    return Crossings(int(target_bytes), dev, res, oom_us, int(top))
