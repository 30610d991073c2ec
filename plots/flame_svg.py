"""A self-contained SVG flame graph of the memory live at one moment.

Root at the top (an "icicle"): each frame's width is the bytes allocated beneath it, children
sorted widest first, so the widest bars are what held the memory. Hovering a frame shows its
``<title>``: the frame, its bytes and its share of the live total. The file has no scripts, no
external fonts or stylesheets, nothing fetched from the network; it opens in any browser and
renders inline in a GitHub issue. Colours say where a frame's code lives (vLLM, FlashInfer, torch,
other Python); memtrace's ``[hook]`` frames and FlashInfer's workspace allocators
(``analysis.categories.WORKSPACE_FUNCTIONS``) are magenta, as in the timeline.

When the flame holds the non-PyTorch memory CUPTI saw (``Flame.non_torch_bytes``), its
``[non-PyTorch, CUPTI]`` frame and categories are teal (the timeline's CUPTI colour), the root and
the subtitle state both parts (PyTorch + non-PyTorch), and when that part is too narrow to read
(under a third of the width: 65 MiB beside 128 GiB of PyTorch's) it is drawn a second time below,
at its own scale. A flame without it renders exactly as before.

When the flame holds the KV cache vLLM (0.34+) committed through CUDA's VMM API (``Flame.vmm_bytes``), its
``[KV cache outside PyTorch (CUDA VMM)]`` frame is the timeline's KV-cache green, the frames below it (the
Python stack that committed each chunk) coloured as any, and the root, the subtitle and the legend name it.
"""

from __future__ import annotations

import colorsys
import dataclasses
import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

from memtrace.analysis.holders.flame import (
    BEFORE_RECORDING,
    HOOK_PREFIX,
    NON_TORCH,
    VMM_KV,
    Flame,
    FlameNode,
    build_tree,
    shared_prefix,
    stack_counts,
    without_prefix,
)
from memtrace.analysis.holders.moment import parse_time_us, seconds_showing
from memtrace.analysis.memory import quantities as Q
from memtrace.analysis.memory.categories import WORKSPACE_FUNCTIONS
from memtrace.plots import oom_text
from memtrace.units import format_bytes

WIDTH = 1200
ROW = 18
PAD = 10
FONT = "Verdana, DejaVu Sans, Arial, sans-serif"
CHAR_PX = 7.0  # average glyph width of 12 px Verdana, to fit labels
MIN_PX = 0.4  # frames narrower than this are not drawn (their bytes stay in their parents)

#: (name, test on the file path in a frame label, hue range) in priority order.
PALETTE = (
    ("FlashInfer", "flashinfer/", (25, 40)),
    ("vLLM", "vllm/", (200, 225)),
    ("torch", "torch/", (0, 12)),
    ("other Python", "", (95, 130)),
)
HOOK_FILL = "rgb(214,60,190)"
MARKER_FILL = "rgb(190,190,190)"
CUPTI_FILL = "rgb(42,157,143)"  # timeline_axes.CUPTI: the non-PyTorch memory CUPTI saw
CUPTI_CATEGORY_FILL = "rgb(132,201,192)"
VMM_KV_FILL = "rgb(85,168,104)"  # palette.VMM_KV_COLOR: the KV cache, committed outside PyTorch
#: The non-PyTorch part is drawn again at its own scale when narrower than this share of the width.
ZOOM_BELOW = 1 / 3
#: Everything beside the widest stack is drawn again at its own scale when that stack holds more than this.
WIDEST_ABOVE = 0.75
_PATH_RE = re.compile(r"\(([^()]*)\)$")


@dataclass(frozen=True)
class FlameSvgDrawn:
    """What the renderer drew, for tests and callers: the total and the widest frames."""

    path: Path
    total_bytes: int
    frames_drawn: int
    depth: int
    top_level: list[tuple[str, int]] = field(default_factory=list)  # root's children, widest first
    non_torch_panel: bool = False  # the non-PyTorch part drawn again below at its own scale
    shared: tuple[str, ...] = ()  # the frames every stack began with, left out (``flame.shared_prefix``)
    rest_panel: bool = False  # what lies beside the widest holder drawn again below at its own scale


def _fill(node: FlameNode, depth: int, parent: str | None = None) -> str:
    if depth == 0 and parent is None:
        return "rgb(150,150,150)"
    if node.name == NON_TORCH:
        return CUPTI_FILL
    if node.name == VMM_KV:
        return VMM_KV_FILL
    if parent == NON_TORCH:
        return CUPTI_CATEGORY_FILL
    if node.kind == "hook" or node.name.split(" (", 1)[0] in WORKSPACE_FUNCTIONS:
        return HOOK_FILL
    if node.kind == "marker":
        return MARKER_FILL
    m = _PATH_RE.search(node.name)
    where = m.group(1) if m else ""
    h = int(hashlib.md5(node.name.encode()).hexdigest()[:6], 16)
    for _, key, (lo, hi) in PALETTE:
        if key in where:
            return _rgb(lo + h % (hi - lo + 1), 0.55 + (h % 20) / 100, 0.62 + ((h >> 8) % 12) / 100)
    return _rgb(110, 0.45, 0.65)


def _rgb(hue: float, sat: float, light: float) -> str:
    """An ``rgb()`` colour (every SVG renderer reads it; not all read ``hsl()``)."""
    r, g, b = colorsys.hls_to_rgb(hue / 360, light, sat)
    return f"rgb({round(r * 255)},{round(g * 255)},{round(b * 255)})"


def short_label(label: str) -> str:
    """``startup (examples/record_startup.py:249)`` -> ``startup:249``: the function and its line, so
    sibling frames of one function called from different lines stay apart."""
    if label.startswith(HOOK_PREFIX):  # the box is bold magenta already
        return label[len(HOOK_PREFIX) :]
    m = _PATH_RE.search(label)
    func = label[: m.start()].rstrip() if m else label
    line = m.group(1).rsplit(":", 1)[1] if m and ":" in m.group(1) else ""
    return f"{func}:{line}" if line.isdigit() else func


def _cut(text: str, n: int) -> str:
    """``text`` in ``n`` characters; a ``func:line`` keeps its line and cuts the function ("sta…:291")."""
    if len(text) <= n:
        return text
    func, _, line = text.rpartition(":")
    if func and line.isdigit() and n - len(line) - 2 >= 2:
        return f"{func[: n - len(line) - 2]}…:{line}"
    return text[: n - 1] + "…"


def fit_label(label: str, nbytes: int | None, width_px: float) -> str:
    """The longest label that fits ``width_px``, bytes kept as long as they fit: "label · size", then
    "func:line · size", then "func:li… · size" (8 characters of the name at least), then "func:line"
    alone, cut if need be; "" if not 3 characters fit."""
    n = int((width_px - 6) / CHAR_PX)
    short = short_label(label)
    if nbytes is None:
        return _cut(label, n) if n >= 3 else ""
    size = format_bytes(nbytes, 2)
    for text in (f"{label} · {size}", f"{short} · {size}"):
        if len(text) <= n:
            return text
    room = n - len(size) - 3
    if room >= min(len(short), 8):
        return f"{_cut(short, room)} · {size}"
    return _cut(short, n) if n >= 3 else ""


def _frames(
    node: FlameNode,
    x: float,
    depth: int,
    scale: float,
    total: int,
    out: list[str],
    stats: list[int],
    top: int,
    parent: str | None = None,
    follow: tuple[str, ...] | None = None,
) -> None:
    """Draw ``node`` and its children; ``parent`` is None for the root (no bytes in its box). With ``follow``
    (the names of a path below ``node``) only that path is drawn in full: every other child is its box alone
    (its frames are in the panel below), and ``()`` is ``node``'s box alone."""
    w = node.total_bytes * scale
    if w < MIN_PX:
        return
    stats[0] += 1
    stats[1] = max(stats[1], depth + 1)
    y = top + depth * ROW
    share = 100.0 * node.total_bytes / total if total else 0.0
    tip = f"{node.name}\n{format_bytes(node.total_bytes, 2)} ({share:.1f}% of live) in {node.count:,} allocation" + (
        "s" if node.count != 1 else ""
    )
    if node.self_bytes and node.children:
        tip += f"\n{format_bytes(node.self_bytes, 2)} allocated in this frame itself"
    cut = follow == () and bool(node.children)
    if cut:
        tip += "\nthe frames below it are drawn in the panel below, at their own scale"
    text = fit_label(node.name, node.total_bytes if depth or parent is not None else None, w)
    weight = ' font-weight="bold"' if node.kind == "hook" else ""
    out.append(
        f'<g><title>{escape(tip)}</title><rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{ROW - 1}" '
        f'fill="{_fill(node, depth, parent)}" rx="2"/>'
        + (f'<text x="{x + 3:.2f}" y="{y + ROW - 5}"{weight}>{escape(text)}</text>' if text else "")
        + "</g>"
    )
    cx = x
    for child in [] if follow == () else node.sorted_children():
        on_path = follow is None or child.name == follow[0]
        _frames(child, cx, depth + 1, scale, total, out, stats, top, node.name,
                None if follow is None else follow[1:] if on_path else ())  # fmt: skip
        cx += child.total_bytes * scale


def _subtitle_lines(subtitle: str, width: int) -> list[str]:
    """The subtitle cut at " · " separators into lines that fit ``width`` (a figure is never cut)."""
    n = int((width - 2 * PAD) / CHAR_PX)
    lines: list[str] = []
    for part in subtitle.split(" · ") if subtitle else []:
        if lines and len(lines[-1]) + 3 + len(part) <= n:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def _legend(y: int, cupti: bool = False, vmm: bool = False, width: int = 0) -> tuple[str, int]:
    """The legend from ``y`` on, in rows that fit ``width`` (one row when 0); returns it and its rows."""
    items = [(name, _rgb((lo + hi) / 2, 0.6, 0.66)) for name, _, (lo, hi) in PALETTE]
    items += [
        ("FlashInfer workspace allocator / [hook] call", HOOK_FILL),
        (f"[no stack] / {BEFORE_RECORDING}", MARKER_FILL),  # the markers as drawn (no stack: short)
    ]
    if cupti:
        items.append((f"{Q.NON_TORCH.label} (CUPTI)", CUPTI_FILL))
    if vmm:
        items.append((Q.VMM.label, VMM_KV_FILL))
    parts, x, rows = [], PAD, 1
    for name, fill in items:
        step = 28 + int(len(name) * CHAR_PX)
        if width and x > PAD and x + step - 12 > width - PAD:  # the next row, rather than past the edge
            x, y, rows = PAD, y + 18, rows + 1
        parts.append(f'<rect x="{x}" y="{y - 11}" width="12" height="12" fill="{fill}" rx="2"/>')
        parts.append(f'<text x="{x + 16}" y="{y}">{escape(name)}</text>')
        x += step
    return "".join(parts), rows


def _shared_note(shared: tuple[str, ...], width: int) -> list[str]:
    """The line(s) naming the frames every stack shares, which the graph leaves out."""
    if not shared:
        return []
    head = f"Not drawn: the {len(shared)} frames every stack begins with: "
    return _wrap(head, [short_label(f) for f in shared], " › ", width)


def _wrap(head: str, parts: list[str], sep: str, width: int) -> list[str]:
    n = int((width - 2 * PAD) / CHAR_PX)
    lines = [head]
    for i, part in enumerate(parts):
        piece = part + (sep if i < len(parts) - 1 else "")
        if len(lines[-1]) + len(piece) > n and lines[-1].strip():
            lines.append("")
        lines[-1] += piece
    return lines


def _panels(flame: Flame, rest, body: list[str], stats: list[int], height: int, width: int, total: int):
    """The panels drawn under the graph at their own scale (CUPTI's non-PyTorch part when it is too thin to read,
    and what the widest box hides beside it); returns the image's new height and whether the CUPTI part was zoomed."""
    part = flame.root.children.get(NON_TORCH)
    zoom = part is not None and part.total_bytes > 0 and part.total_bytes < ZOOM_BELOW * total
    panels: list[tuple[str, FlameNode]] = []
    if zoom:
        panels.append((f"The {Q.NON_TORCH.label} memory CUPTI saw, at its own scale: {format_bytes(part.total_bytes, 2)} "
                       "across the full width", part))  # fmt: skip
    if rest is not None:
        panels.append(rest)
    for heading, node in panels:
        heading_y = height - PAD - 2  # the row under the graph drawn last
        body.append(f'<text x="{PAD}" y="{heading_y}" font-weight="bold">{escape(heading)}</text>')
        panel = [0, 0]
        parent = "all" if node is part else None  # the CUPTI part keeps its colour; the rest gets a grey root
        _frames(node, PAD, 0, (width - 2 * PAD) / node.total_bytes, total, body, panel, heading_y + 8, parent)
        stats[0] += panel[0]
        height = heading_y + 8 + panel[1] * ROW + 2 * PAD + 18
    return height, zoom


def render_flame_svg(
    flame: Flame,
    path: str | os.PathLike,
    *,
    title: str,
    subtitle: str = "",
    width: int = WIDTH,
    drop_shared: bool = True,
) -> FlameSvgDrawn:
    """Write ``flame`` as an SVG flame graph to ``path``.

    Args:
        flame: the tree (``memtrace.analysis.holders.flame.flame_at``).
        path: the output file.
        title: first line, e.g. "Live GPU memory at the peak: 18.000 s, profile_run".
        subtitle: what ran and the totals, parts joined by " · " (wrapped at those joins); the
            PyTorch and non-PyTorch parts are added when the flame holds CUPTI's records.
        width: image width in pixels.
        drop_shared: leave out the frames every stack begins with (``flame.shared_prefix``: the
            multiprocessing and vLLM launcher frames), named in a note above the graph.
    """
    shared = shared_prefix(flame) if drop_shared else ()
    flame = without_prefix(flame, shared)
    total = flame.total_bytes
    scale = (width - 2 * PAD) / total if total else 0.0
    body: list[str] = []
    stats = [0, 0]
    what = "live memory" if flame.since_us is None else "allocated in the window and still live"
    name = f"all {what}: {format_bytes(total, 2)}"
    cupti = flame.non_torch_bytes is not None
    vmm = flame.vmm_bytes is not None
    if cupti or vmm:
        split = _split(flame)
        name += f" = {split}"
        subtitle = " · ".join(p for p in (subtitle, f"shown: {split}") if p)
    root = dataclasses.replace(flame.root, name=name)
    subs = _subtitle_lines(subtitle, width)
    note = _shared_note(shared, width)
    note_y = 44 + 18 * max(len(subs), 1)
    legend_y = note_y + 18 * len(note) + 2
    legend, legend_rows = _legend(legend_y, cupti, vmm, width)
    top = legend_y + 10 + 18 * (legend_rows - 1)
    widest, rest = _beside_widest(flame)
    if total:
        _frames(root, PAD, 0, scale, total, body, stats, top, None, widest)
    height = top + max(stats[1], 1) * ROW + 2 * PAD + 18
    height, zoom = _panels(flame, rest, body, stats, height, width, total)
    footer_y = height - PAD
    svg = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="{FONT}" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{PAD}" y="24" font-size="17" font-weight="bold">{escape(title)}</text>',
        *(f'<text x="{PAD}" y="{44 + 18 * i}" fill="#333">{escape(line)}</text>' for i, line in enumerate(subs)),
        *(
            f'<text x="{PAD}" y="{note_y + 18 * i}" fill="#666" font-style="italic">{escape(line)}</text>'
            for i, line in enumerate(note)
        ),  # fmt: skip
        legend,
        *body,
        f'<text x="{PAD}" y="{footer_y}" fill="#666" font-size="11">Width = bytes live at that moment; '
        "root at the top, callers above callees; name:line · bytes in each box, the full frame and "
        "share on hover. memtrace</text>",
        "</svg>",
    ]
    out = Path(path)
    out.write_text("\n".join(svg) + "\n", encoding="utf-8")
    top_level = [(c.name, c.total_bytes) for c in root.sorted_children()]
    return FlameSvgDrawn(out, total, stats[0], stats[1], top_level, zoom, shared, rest is not None)


def _beside_widest(flame: Flame) -> tuple[tuple[str, ...] | None, tuple[str, FlameNode] | None]:
    """(the widest stack, (heading, tree) of everything else) when that one stack holds more than
    :data:`WIDEST_ABOVE` of the total: the graph then draws it in full and the rest again below, at its own
    scale, so the other holders are wide and named too; (None, None) otherwise."""
    total = flame.total_bytes
    if not flame.stacks or not total:
        return None, None
    path, nbytes = max(flame.stacks.items(), key=lambda kv: (kv[1], kv[0]))
    if nbytes <= WIDEST_ABOVE * total or nbytes == total:
        return None, None
    counts = stack_counts(flame)
    others = {p: b for p, b in flame.stacks.items() if p != path}
    tree = build_tree(others, {p: counts[p] for p in others})
    leaf = short_label(path[-1])
    tree.name = f"all but {leaf} ({format_bytes(nbytes, 2)}): {format_bytes(tree.total_bytes, 2)}"
    heading = (f"Beside the widest stack, {leaf} ({format_bytes(nbytes, 2)}, {100.0 * nbytes / total:.0f}%): "
               f"the other {format_bytes(tree.total_bytes, 2)} at their own scale, across the full width")  # fmt: skip
    return path, (heading, tree)


def _split(flame: Flame) -> str:
    """``PyTorch 11.06 GiB + non-PyTorch (CUPTI) 65 MiB + KV cache outside PyTorch (CUDA VMM) 126.23 GiB``."""
    parts = [f"PyTorch {format_bytes(flame.torch_bytes, 2)}"]
    if flame.non_torch_bytes is not None:
        parts.append(f"{Q.NON_TORCH.label} (CUPTI) {format_bytes(flame.non_torch_bytes, 2)}")
    if flame.vmm_bytes is not None:
        parts.append(f"{Q.VMM.label} {format_bytes(flame.vmm_bytes, 2)}")
    return " + ".join(parts)


def say_flame(rank, moment, flame: Flame, log) -> None:
    """One line on ``log`` (when given): what the flame graph holds, and at which moment."""
    if log is None:
        return
    held = f"added since {moment.since_what} and live" if moment.since_us is not None else "live"
    split = ""
    if flame.non_torch_bytes is not None:
        split = (f" (PyTorch {format_bytes(flame.torch_bytes, 2)} + {Q.NON_TORCH.label} {format_bytes(flame.non_torch_bytes, 2)}"
                 " CUPTI saw)")  # fmt: skip
    if flame.vmm_bytes is not None:
        split = split[:-1] if split else f" (PyTorch {format_bytes(flame.torch_bytes, 2)}"
        split += f" + KV cache {format_bytes(flame.vmm_bytes, 2)} committed through CUDA VMM)"
    if moment.what.endswith(" s") and parse_time_us(moment.what[:-2]) is not None:  # --at 179.5: said once
        when = moment.what
    else:  # a named moment: its time as --at must be given to show the same bytes
        secs = seconds_showing(rank, moment.time_us, moment.since_us, flame)
        when = f"{moment.what} ({secs} s)"
    log.write(f"memtrace: {rank.label}: {format_bytes(flame.total_bytes, 2)}{split} {held} at {when}\n")


def render(run, out: str | os.PathLike, *, at: str = "peak", since: str | None = None, added: bool = False,
           torch_only: bool = False, log=None) -> None:  # fmt: skip
    """The flame graph of the run's worst rank (``AnalysedRun.worst``; ``--rank`` leaves one) at ``at``
    (``analysis.moment``), titled by ``analysis.titles.flame_titles``."""
    from pathlib import Path

    from memtrace.analysis.analysed.titles import flame_titles
    from memtrace.analysis.holders.moment import flame_for, rank_at

    rank = rank_at(run.worst, at)
    moment, flame = flame_for(rank, at, since=since, added=added, non_torch=not torch_only)
    words = oom_text.details(rank.oom, rank.trace.process.device_total_bytes) if rank.oom is not None else ""
    title, subtitle = flame_titles(rank, flame, moment, fallback=Path(run.path).name, oom_words=words)
    render_flame_svg(flame, out, title=title, subtitle=subtitle)
    say_flame(rank, moment, flame, log)
