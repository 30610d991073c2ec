"""The serving window: what filled the GPU while vLLM served, and what held it at the end."""
