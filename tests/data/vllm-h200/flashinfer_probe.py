"""Call FlashInfer 0.6.13's real b12x workspace allocators on a GPU with memtrace's hooks installed.

Run on the device (see record.sh): ``python3 flashinfer_probe.py RUN_DIR``. The hooks are installed
*before* FlashInfer is imported (the post-import path), the allocator is called through the module
and through the package's re-export, and once through ``allocate_sm120_moe_workspace`` (a nested,
parented call). Prints every recorded HookCall; the trace lands in RUN_DIR.
"""

import sys

import torch
from memtrace.capture import api
from memtrace.plugins import surface
from memtrace.plugins.hooks import HookManager

ARGS = dict(state_E=128, weight_E=128, routed_rows=65536, k=2048, n=768, num_topk=8)
EXPECTED_DYNAMIC_BYTES = 94_974_860  # sum of the 0.6.13 tensor list (shared notes), for this shape

session = api.start(sys.argv[1], role="flashinfer-probe")
manager = HookManager()
surface.install_workspace_hooks(manager, session.record_hook_call)
import flashinfer  # noqa: E402
from flashinfer.fused_moe.cute_dsl import blackwell_sm12x  # noqa: E402
from flashinfer.fused_moe.cute_dsl.blackwell_sm12x import moe_dispatch as M  # noqa: E402

print("flashinfer", flashinfer.__version__, "patched:", sorted({path for path, _ in manager._done}))
dev = torch.device("cuda")
keep = []
with api.phase("dynamic_direct"):
    keep.append(M.allocate_sm120_dynamic_workspace(**ARGS, device=dev))
with api.phase("dynamic_reexport"):
    keep.append(blackwell_sm12x.allocate_sm120_dynamic_workspace(**ARGS, device=dev))
with api.phase("moe_workspace_dynamic"):
    keep.append(M.allocate_sm120_moe_workspace(**ARGS, device=dev, backend="dynamic"))
torch.cuda.synchronize()
path = api.stop()
from memtrace.store import load_trace  # noqa: E402

for c in load_trace(path).hook_calls:
    print(
        f"HOOKCALL {c.name.split(':')[-1]} parent={c.parent} returned_bytes={c.returned_bytes} "
        f"allocated_delta={c.allocated_delta_bytes} reserved_delta={c.reserved_delta_bytes} "
        f"us={c.end_us - c.start_us} args={c.args}"
    )
print("expected dynamic bytes", EXPECTED_DYNAMIC_BYTES, "trace", path)
