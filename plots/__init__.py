"""memtrace.plots: renderers (timeline, flame graph, text). They read analysis results only."""
