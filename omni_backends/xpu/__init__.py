"""Intel XPU driver on vLLM's XPU platform (native ``torch.xpu``)."""
