"""memtrace.exporters: write traces in other tools' formats (Perfetto/Chrome JSON, memory_viz snapshots).

Exporters read the model and analysis results only; they never import torch.
"""
