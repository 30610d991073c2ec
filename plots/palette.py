"""The colours of memtrace's figures, one place for the PNG/SVG timeline and the view's page."""

from __future__ import annotations

from memtrace.analysis.memory.quantities import VMM

#: Allocated memory by category (``analysis.categories.CATEGORIES``), as both the timeline and the view draw it.
CATEGORY_COLORS = {
    "weights": "#4C72B0",
    "kv_cache": "#55A868",
    "flashinfer_workspace": "#D63CBE",
    "cudagraph_pool": "#8172B2",
    "activations": "#F0A030",
    "other": "#B0B0B0",
}

#: The KV cache vLLM (0.34+) commits through CUDA's VMM API, outside PyTorch: the KV cache's colour, hatched
#: (the same category, allocated another way), wherever it is drawn.
VMM_KV_COLOR = "#55A868"
VMM_KV_EDGE = "#1E6B35"
VMM_KV_LABEL = VMM.label  # its one name (analysis.quantities)
