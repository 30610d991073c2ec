"""The colours of memtrace's figures, one place for the PNG/SVG timeline and the view's page."""

from __future__ import annotations

#: Allocated memory by category (``analysis.categories.CATEGORIES``), as both the timeline and the view draw it.
CATEGORY_COLORS = {
    "weights": "#4C72B0",
    "kv_cache": "#55A868",
    "flashinfer_workspace": "#D63CBE",
    "cudagraph_pool": "#8172B2",
    "activations": "#F0A030",
    "other": "#B0B0B0",
}
