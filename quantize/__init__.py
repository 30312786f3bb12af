"""Quantization pipeline (``localllm quantize``), built on the core's API."""
