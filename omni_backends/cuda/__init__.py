"""CUDA driver on vLLM (NVIDIA GPUs)."""
