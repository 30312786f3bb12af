"""A tool and a conversation in Ollama's shapes, for the tests of tools on ``/api/chat``
(``serve MODEL``'s and the router's)."""

from __future__ import annotations

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# an earlier turn in Ollama's shapes (a call's arguments an object, no id; the result named by tool_name):
# SmolLM2 answers the next question the same way, with a call, where alone it would answer in words
CALLED = [{"role": "user", "content": "What is the weather in Rome?"},
          {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
          {"role": "tool", "content": "sunny, 25 C", "tool_name": "get_weather"},
          {"role": "assistant", "content": "It is sunny in Rome, 25 C."},
          {"role": "user", "content": "What is the weather in Paris?"}]
