"""A reasoning model's thinking, kept apart from its answer: one split for every
route (chat completions' ``reasoning_content``, Messages' ``thinking`` blocks,
Responses' reasoning items) and for the tool-call parsers (issue 47 item 6).

- ``markers``: the thinking delimiters the model's chat template uses, and
  whether its generation prompt opens the thinking already (DeepSeek R1's and
  Qwen3's templates end the prompt with ``<think>``: the reply starts inside).
- ``Splitter``: the reply, streamed piece by piece or whole, as (kind, text)
  parts, kind "reasoning" or "content"; a marker cut between two pieces is held
  back until it is whole, so no client ever sees half of ``</think>``. gpt-oss's
  harmony channels split the same way (``harmony``: analysis is the thinking).
"""

from localllm.reasoning.split import HARMONY, MARKERS, Markers, Splitter, markers, split

__all__ = ["HARMONY", "MARKERS", "Markers", "Splitter", "markers", "split"]
