"""What a snapshot's trace entries hold beyond the event columns, kept so that nothing is dropped.

``EVENT_DTYPE`` has columns for time, action, address, size, stream and stack. A torch snapshot's
entries also carry ``compile_context`` (torch.compile's frame, ``"N/A"`` when none), ``user_metadata``
(``torch.cuda.memory._set_memory_metadata``, and the payload of an ``annotate`` entry) and, from torch
2.14, ``pool_id`` (the memory pool of the entry). They are kept in the trace's facts under
``snapshot_fields`` as runs: ``{"values": [[compile_context, user_metadata, pool_id], ...], "runs":
[[first_event, count, value_index], ...]}``; events outside every run have torch's defaults. The
memory_viz exporter writes them back, so import -> export -> import keeps them.

Entries whose action this memtrace does not know (a newer torch) carry no column here either: they are
counted by action, with the bytes they carried, and named in a warning note (:func:`unknown_note`).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

#: torch's values for an entry without them (``"N/A"`` is what torch writes when no context was recorded).
DEFAULT_CONTEXT, DEFAULT_METADATA, DEFAULT_POOL = "N/A", "", (0, 0)
_CONTEXT_DEFAULTS = (None, "", DEFAULT_CONTEXT)
_METADATA_DEFAULTS = (None, DEFAULT_METADATA)


def _column(entries: Sequence[dict[str, Any]], key: str) -> list[Any]:
    return list(map(operator.methodcaller("get", key), entries))


def _distinct(entries: Sequence[dict[str, Any]], key: str) -> set[Any]:
    """The distinct values of ``entry[key]`` (None for a missing key), at C speed when every entry has it."""
    try:
        return set(map(operator.itemgetter(key), entries))
    except KeyError:
        pass
    except TypeError:  # an unhashable value (a list)
        return set(map(_hashable, _column(entries, key)))
    try:
        return set(map(operator.methodcaller("get", key), entries))
    except TypeError:
        return set(map(_hashable, _column(entries, key)))


def _pool(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    try:
        a, b = value
        return (int(a), int(b))
    except (TypeError, ValueError):
        return None


def entry_fields(entries: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``snapshot_fields`` document of ``entries`` (the entries that became events, in order), or
    None when every entry has torch's defaults (the common case, checked at C speed)."""
    plain = _distinct(entries, "compile_context") <= set(_CONTEXT_DEFAULTS)
    plain = plain and _distinct(entries, "user_metadata") <= set(_METADATA_DEFAULTS)
    if plain and all(p is None or _pool(p) == DEFAULT_POOL for p in _distinct(entries, "pool_id")):
        return None
    contexts = _column(entries, "compile_context")
    metadata = _column(entries, "user_metadata")
    pools = _column(entries, "pool_id")
    values: list[tuple[str, str, tuple[int, int]]] = []
    index: dict[tuple[str, str, tuple[int, int]], int] = {}
    runs: list[list[int]] = []
    default = (DEFAULT_CONTEXT, DEFAULT_METADATA, DEFAULT_POOL)
    for i, (c, m, p) in enumerate(zip(contexts, metadata, pools, strict=True)):
        key = (
            DEFAULT_CONTEXT if c in _CONTEXT_DEFAULTS else str(c),
            DEFAULT_METADATA if m is None else str(m),
            _pool(p) or DEFAULT_POOL,
        )
        if key == default:
            continue
        v = index.get(key)
        if v is None:
            v = index[key] = len(values)
            values.append(key)
        if runs and runs[-1][2] == v and runs[-1][0] + runs[-1][1] == i:
            runs[-1][1] += 1
        else:
            runs.append([i, 1, v])
    return {"values": [[c, m, list(p)] for c, m, p in values], "runs": runs}


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def fields_by_event(doc: dict[str, Any] | None, n: int) -> tuple[np.ndarray, list[tuple[str, str, tuple[int, int]]]]:
    """Per event, the index of its (compile_context, user_metadata, pool_id) in the returned list (-1:
    torch's defaults), from a ``snapshot_fields`` document."""
    which = np.full(n, -1, dtype=np.int32)
    if not doc:
        return which, []
    values = [(str(c), str(m), (int(p[0]), int(p[1]))) for c, m, p in doc.get("values", [])]
    for first, count, v in doc.get("runs", []):
        which[int(first) : int(first) + int(count)] = int(v)
    return which, values


def count_unknown(entries: Sequence[dict[str, Any]], known: dict[str, int]) -> dict[str, list[int]]:
    """``{action: [entries, bytes]}`` of the entries whose action is not in ``known``."""
    out: dict[str, list[int]] = {}
    for e in entries:
        action = e.get("action")
        if action in known:
            continue
        seen = out.setdefault(str(action), [0, 0])
        seen[0] += 1
        try:
            seen[1] += int(e.get("size") or 0)
        except (TypeError, ValueError):
            pass
    return out


def unknown_note(unknown: dict[str, list[int]]) -> str:
    """The warning that names every unknown action, how many entries, and the bytes they carried."""
    parts = ", ".join(f"'{a}' ({n:,} entr{'y' if n == 1 else 'ies'}, {b:,} B)" for a, (n, b) in sorted(unknown.items()))
    return (
        f"the snapshot holds trace actions this memtrace does not know: {parts}; they were left out of "
        "every curve and figure (a newer PyTorch? upgrade memtrace)"
    )
