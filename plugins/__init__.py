"""memtrace.plugins: the vLLM general plugin, FlashInfer hooks and the pytest plugin."""

import time as _time

#: When this package began importing (``perf_counter_ns``): vLLM importing the plugin is part of its
#: registration cost (``plugins.vllm`` charges it to ``registration`` once its own import is done).
IMPORT_T0_NS = _time.perf_counter_ns()
