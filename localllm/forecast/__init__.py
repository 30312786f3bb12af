"""The TTFT forecast: how long the next prompt will take to read, before Enter.

No anchor shows this (llama-server reports prefill progress only while it runs:
``return_progress``). From this session's measured prefills (``Forecaster.observe``)
it predicts the prefill of N new tokens (those not already in the KV cache) and
the TTFT around it; with nothing measured it says n/a, never a guess. ``room``
says whether a prompt fits the context, and which ``--ctx`` and KV cache type
would (the planner's largest context per cache type); ``prompt`` counts a
message's and an attachment's tokens with the model's tokenizer. Pure Python on plan's
figures: the cockpit calls it on every keystroke, so it takes microseconds.
"""

from localllm.forecast.model import Forecast, Forecaster, Point, Progress, format_line
from localllm.forecast.prompt import check_message, count, new_tokens, reply_room
from localllm.forecast.room import Room, advice, check, suggestion

__all__ = ["Forecast", "Forecaster", "Point", "Progress", "Room", "advice", "check", "check_message", "count", "format_line", "new_tokens",
           "reply_room", "suggestion"]
