"""A message's tokens counted before sending are the tokens the chat session
then appends (SmolLM2's template, real llama.cpp), and the check refuses with
the planner's advice what does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.chat.session import ChatSession
from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.forecast import check_message, new_tokens


@pytest.mark.slow
def test_the_count_before_sending_is_what_the_session_appends(smollm2: Path) -> None:
    with LlamaCppBackend() as b:
        b.load(smollm2, LoadConfig(n_ctx=512))
        s = ChatSession(b, sampling=SamplingConfig(temperature=0, max_tokens=4, ignore_eos=True))
        for slack, text in ((0, "Name a fruit."), (2, "File: a.md\n```markdown\n# Notes\n<|im_end|> stays text\n```\n\nAnd another?")):
            new = {"role": "user", "content": text, "data": "file"}
            counted = new_tokens(b, s.messages, new)
            gen = s.send_messages([new])
            list(gen)
            # exact for a first message; after a reply, its last sampled token (not yet evaluated) and
            # its text tokenized again may differ by a token or two
            assert gen.stats is not None and 0 <= gen.stats.prompt_tokens - counted <= slack, (gen.stats.prompt_tokens, counted)
        room, line = check_message(b, s.messages, {"role": "user", "content": "word " * 600}, n_predict=64,
                                   max_ctx_by_kv_type={"f16": 8192})
        assert room.history == b.context_used and not room.fits
        assert line is not None and line.startswith("the message does not fit the context: ") and line.endswith(
            f"load with --ctx {-(-room.needed // 256) * 256} --kv-type f16 (fits this device)")
