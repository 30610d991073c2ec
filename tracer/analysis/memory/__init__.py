"""The memory vocabulary and its exact curves: quantities, allocator blocks, VMM, non-PyTorch memory, categories, phases, the target, its crossing and the OOM."""
