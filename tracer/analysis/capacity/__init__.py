"""Will it boot: vLLM's KV sizing and the start-up carried onto another card or other flags."""
