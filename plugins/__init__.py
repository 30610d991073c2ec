"""memtrace.plugins: the vLLM general plugin, FlashInfer hooks and the pytest plugin."""
