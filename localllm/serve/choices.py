"""The ``n`` choices of one request: a scheduler job each, one event queue.

Each choice is its own sequence with its own sampler; the seeds are the
request's ``seed`` + index (so ``n: 1`` draws as before, and a fixed seed
repeats all n replies); without a seed each draws from its own random seed.
Choice 0 reads the prompt; the others wait for it and share its cells
(``Job.after``: the scheduler's prefix reuse copies them with seq_cp), so the
prompt is read once. Events arrive as ``(index, kind, payload)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import cast

from localllm.engine_api import SamplingConfig
from localllm.reasoning import Markers, split
from localllm.serve import logprobs
from localllm.serve.media import media_of
from localllm.serve.protocol import GenParams, Shaper
from localllm.serve.scheduler import Job
from localllm.serve.tools import parse_reply


class Choices:
    def __init__(self, params: GenParams, tokens: list[int], sampling: SamplingConfig, max_tokens: int,
                 put: Callable[[tuple[int, str, object]], None]) -> None:
        self.params = params
        self.jobs: list[Job] = []
        top = logprobs.top_needed(params.logprobs, params.n_probs)
        media = media_of(tokens)  # the prompt's images, read by choice 0 (the others share its cells)
        for i in range(params.n):
            seed = None if sampling.seed is None else (sampling.seed + i) & 0xFFFFFFFF

            def emit(kind: str, payload: object, i: int = i) -> None:
                put((i, kind, payload))

            self.jobs.append(Job(tokens=tokens, sampling=replace(sampling, seed=seed), max_tokens=max_tokens, emit=emit,
                                 stop=params.stop, logprobs=top, cache_prompt=params.cache_prompt, progress=params.return_progress,
                                 post_sampling=params.post_sampling_probs,
                                 n_indent=params.n_indent, t_max_predict_ms=params.t_max_predict_ms,
                                 after=self.jobs[0] if self.jobs else None, lora=params.lora, media=media,
                                 id_slot=params.id_slot if i == 0 else -1))
        self.texts: list[list[str]] = [[] for _ in self.jobs]
        self.pending: list[list[logprobs.Raw]] = [[] for _ in self.jobs]  # log-probabilities not yet sent
        self.sent: list[list[logprobs.Raw]] = [[] for _ in self.jobs]
        self.offsets = [0] * len(self.jobs)  # characters of each reply covered by sent log-probabilities
        # a reasoning model's thinking: (its markers, whether the prompt opened it, deepseek-legacy: left in the text too); None: not split
        self.think: tuple[Markers, bool, bool] | None = None

    def add(self, i: int, kind: str, payload: object) -> None:
        if kind == "text":
            assert isinstance(payload, str)
            self.texts[i].append(payload)
        elif kind == "logprob":
            self.pending[i].append(cast(logprobs.Raw, payload))  # the scheduler's tuple

    def take_logprobs(self, i: int) -> dict | None:
        """The log-probabilities gathered for choice ``i`` since the last call, shaped for the response."""
        p = self.params
        if p.logprobs is None and p.n_probs is None:
            return None
        raw, self.pending[i] = self.pending[i], []
        self.sent[i].extend(raw)
        if not p.chat and p.logprobs is not None:
            out = logprobs.legacy(raw, p.logprobs, self.offsets[i])
            self.offsets[i] += sum(len(t) for t in out["tokens"])
            return out
        n_top = p.n_probs if p.logprobs is None else max(p.logprobs, p.n_probs or 0)
        return {"content": logprobs.content(raw, n_top or 0, ids=p.n_probs is not None, post=p.post_sampling_probs)}

    def usage(self) -> dict:
        """OpenAI's: the prompt once, the completion tokens of every choice; cached tokens are choice 0's (it read the prompt)."""
        u = self.jobs[0].usage()
        if len(self.jobs) > 1:
            u["completion_tokens"] = sum(j.n_gen for j in self.jobs)
            u["total_tokens"] = u["prompt_tokens"] + u["completion_tokens"]
        return u

    def response(self, shaper: Shaper) -> dict:
        """The whole (non-streamed) answer: one choice per job, in index order;
        with tools, each reply's calls parsed out of its text."""
        out = None
        tools = self.params.tools
        for i, job in enumerate(self.jobs):
            text, calls = "".join(self.texts[i]), None
            if self.think is not None:
                marks, opened, legacy = self.think
                reasoning, answer = split(text, marks, started_open=opened)
                text = text if legacy else answer
                if reasoning:
                    shaper.reasoning[i] = reasoning
            if tools:
                text, calls = parse_reply(text, tools.fmt, {f["name"] for f in tools.functions})
                job.finish_reason = "tool_calls" if calls and job.finish_reason == "stop" else job.finish_reason
            one = shaper.full(text, job, calls, index=i, logprobs=self.take_logprobs(i))
            if out is None:
                out = one
            else:
                out["choices"].extend(one["choices"])
        assert out is not None  # n >= 1
        if len(self.jobs) > 1:
            out["usage"] = self.usage()
        return out
