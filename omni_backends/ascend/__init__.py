"""Ascend NPU driver on vllm-ascend (device name ``npu``, alias ``ascend``)."""
