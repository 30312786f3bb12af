"""localllm: run, measure and shrink LLMs on your own laptop, offline.

Nothing is imported here beyond the version, so ``localllm --help`` stays fast.
"""

__version__ = "0.1.0"
