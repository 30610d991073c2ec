"""Names vulture (60 %) reports in tracer/, plugins/ and plots/ that are used where it cannot see.

Made with ``vulture tracer plugins plots --min-confidence 60 --make-whitelist`` and read entry by entry:
each line says who uses the name. Anything dead was deleted, and anything only tests called moved to
tests/ (issue 33), so it is not listed here. A new finding means new dead code, or a new entry with its
reason. .ci/run runs ``vulture tracer plugins plots .ci/vulture_whitelist.py --min-confidence 60``.
"""

# ruff: noqa: B018, F821
# fmt: off

# -- called by a framework, by name -----------------------------------------------------------------------
pytest_addoption  # plugins/pytest_plugin.py: pytest hook (entry point pytest11 = memtrace)
pytest_configure  # pytest hook
pytest_runtest_setup  # pytest hook
_.pytest_runtest_call  # pytest hook, on the plugin's hookwrapper classes (two of them)
pytest_runtest_teardown  # pytest hook
pytest_runtest_makereport  # pytest hook
memtrace_budget  # pytest fixture users request by name (docs/gating.md)
_.invalidate_caches  # plugins/post_import.py: importlib's MetaPathFinder protocol (importlib.invalidate_caches)
__getattr__  # tracer/__init__.py: PEP 562 module __getattr__ (lazy public API)
__dir__  # tracer/__init__.py: PEP 562 module __dir__
daemon_threads  # tracer/cli/_serve.py: socketserver.ThreadingMixIn option
_.do_GET  # tracer/cli/_serve.py: http.server.BaseHTTPRequestHandler dispatches GET to it
_.log_message  # tracer/cli/_serve.py: BaseHTTPRequestHandler override (no request log on stderr)
_._negative_number_matcher  # tracer/cli/__init__.py: argparse reads it (negative numbers as values)
_.extra_run  # tracer/cli/fits.py: set on the Namespace, read back by name (analysed(args, "extra_run"))
_.completed  # tracer/progress.py: a task's progress, read by the progress line (and test_progress)

# -- public API whose callers live outside the package ---------------------------------------------------
runtime_env  # tracer/capture/ray_gather.py: a Ray program's actors' runtime_env (docs/recording.md,
             # tests/distributed/gloo_program.py)
widest_leaves  # tracer/analysis/holders/flame.py: examples/render_figures.py
_.unpatch  # plugins/hooks.py: every hook is undoable (STYLE rule 4); the tests undo each patch with it

# -- fact keys: the registry (tracer/facts.py) lists each key with its writer -----------------------------
MEMORY_FRACTION  # written by examples/record_startup.py
DIED_IN  # written by examples/record_startup.py
STARTUP_OUTCOME  # written by examples/record_startup.py
TORCH_COUNTERS  # written by examples/record_startup.py
VLLM_NON_TORCH_AT_INIT_BYTES  # "vllm.non_torch_at_init_bytes" in recorded traces (test_fits, test_real_traces)

# -- closed lists of values a docstring names as the list -----------------------------------------------
ENV_FIELDS  # tracer/analysis/gate/history_key.py: the fingerprint's environment fields (diff.py, its docstring)

# -- fields of records the package returns, read where vulture cannot see: in JSON (dataclasses.asdict, or
# summary_to_dict's dataclasses.fields walk) or by the caller of a renderer that returns what it drew ----------
frames_drawn  # plots/flame_svg.FlameSvgDrawn: render's return value, what it drew (tests/bench/bench_plots)
non_torch_panel  # FlameSvgDrawn: whether the non-PyTorch panel was drawn (test_flame_cupti)
rest_panel  # FlameSvgDrawn: whether the other-processes panel was drawn (test_flame_shared)
zoom_us  # plots/timeline.RankDrawn: render's return value, what it drew (test_timeline)
phase_labels  # RankDrawn (test_timeline)
annotation_corner  # RankDrawn (test_timeline)
lane_px_per_s  # RankDrawn (test_timeline, test_timeline_axis)
lane_char_px  # RankDrawn (test_timeline)
y_unit  # RankDrawn: the y axis's unit it drew in (test_cpu_profiler_figures: KiB for a CPU trace)
zoom_title  # RankDrawn: what the zoom panel looked at (test_cpu_profiler_figures)
y_top  # RankDrawn: the main plot's y axis's top (test_one_run_in_time: no 210 GiB axis on a 139.8 GiB card)
lane_label  # RankDrawn: the phase lane's label (test_one_run_in_time: none on a trace without phases)
x_label  # RankDrawn: the main plot's x label (test_one_run_in_time: "one moment", no time axis)
post_kv_peak_phase  # tracer/analysis/fits.Fit: in fits' JSON (fit_to_dict: dataclasses.asdict)
recorded_capacity_bytes  # Fit: in fits' JSON
kv_available_bytes  # Fit: in fits' JSON (version 3: vLLM's available KV figure beside the whole blocks)
after_kv  # tracer/analysis/whatif.PhasePeak: in the what-if JSON (answer_to_dict: dataclasses.asdict)
peak_reserved_us  # tracer/analysis/phases.PhaseStats: in report --json (traces[].phases[])
reserved_peak_bytes  # tracer/analysis/vmm.VmmSummary: in report --json (traces[].vmm)
committed_bytes  # VmmSummary: in report --json (traces[].vmm), everything committed through CUDA VMM at the end
available_memtrace_bytes  # tracer/analysis/extensible.ExtensibleSizing: in report --json (traces[].extensible),
                          # vLLM's formula on memtrace's terms beside available_bytes (vLLM's inputs)
memtrace_threads_ns  # tracer/analysis/self_cost.SelfCost: in report --json (traces[].self_cost), memtrace's
                     # own threads' time, left out of the cost
startup_us  # SelfCost: in report --json (traces[].self_cost), the start-up's span beside init_engine_us
used_all_bytes  # tracer/analysis/serving_held.Holders: in report --json (traces[].serving.device), the whole
                # device's used memory the other rows are read from (test_serving_real_oom)
alloc_stack  # tracer/analysis/user_metadata.TensorNote: in report --json (traces[].tensor_notes[]), the
             # annotated block's allocating stack id (alloc_frame is the frame a report prints)
others_how  # tracer/model.ServingWindow: written in the window document (store.py), how other processes'
            # memory was told apart (test_serving_window round-trips it)
install_workspace_hooks  # plugins/surface.py: the table's FlashInfer allocators hooked by the GPU scripts that record
                         # FlashInfer alone (tests/gpu/seed_b12x.py, tests/data/vllm-h200/flashinfer_probe.py)

# -- issue 43: the priors' refit machinery, run by one script (not by the CLI) --
page_bytes  # shape.KVPlan.page_bytes: one layer's page, the figure test_shape holds against vLLM's own specs
