"""memtrace.plugins: the vLLM general plugin, FlashInfer hooks and the pytest plugin."""

import time as _time

#: When this package began importing (``perf_counter_ns``): vLLM importing the plugin is part of its
#: registration cost (``plugins.vllm`` charges it to ``registration`` once its own import is done).
IMPORT_T0_NS = _time.perf_counter_ns()

#: When the trace ends (``MEMTRACE_UNTIL``): at the end of start-up, at exit, or start-up then a bounded
#: serving window (``docs/serving.md``). Here, not in ``plugins.vllm``, so that ``memtrace``'s parser (the
#: ``run`` command's ``--until``) imports none of the plugin (~27 ms on every command).
UNTIL_CHOICES = ("startup", "exit", "serving")
