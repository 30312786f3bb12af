"""Compaction against the sliding window: a 60-turn conversation in a 2,048-token context on SmolLM2.

Facts are planted in the first turns ("My locker code is 4817."),
then filler turns ("Tell me one short fact about volcanoes.") push the
conversation past the context more than once. At the end each fact is asked for
("What is my locker code?"); an answer counts when it holds the planted value
verbatim (exact match, case-sensitive). Every question is asked of the same
conversation (each taken back with ``rewind`` before the next). Both runs send
the same user messages, greedy (temperature 0), each reply bounded:

- sliding window: the engine shifts the full context, keeping the system prompt
  (``chat`` and the cockpit without compaction);
- compaction: after each turn, once the context is 85% full, the turns before
  the last two are replaced by a summary the model writes (``localllm.compaction``,
  as ``chat --compact-at 0.85`` and the cockpit do); the window still slides if
  a reply outgrows what is left.

A ceiling run asks the questions right after the facts, all still in the
context: what the model recalls at best. Figures: the tokens the cache holds at
the end, the compactions with their tokens before and after and the seconds
each took, the shifts, and the recall counts out of N. A 135M model recalls
poorly either way: the counts are reported as they come.

    python scripts/bench_compact.py [--model smollm2] [--threads N] [--json] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localllm import runtime  # noqa: E402
from localllm.chat.session import ChatSession  # noqa: E402
from localllm.compaction import KEEP_TURNS, compactable, should_compact  # noqa: E402
from localllm.compaction.conversation import Compaction, NotCompacted, compact  # noqa: E402
from localllm.engine_api import Engine, SamplingConfig  # noqa: E402
from localllm.plan import fitting  # noqa: E402

SYSTEM = "You are a helpful assistant. Answer briefly."
COMPACT_AT = 0.85
# (what the user says, the question, the exact answer). Plain statements: SmolLM2-135M recalled 5 of these 6 in
# the context, and none when each was put as "Please remember: ..." (it answered every question with an apology)
FACTS: tuple[tuple[str, str, str], ...] = (
    ("My locker code is 4817.", "What is my locker code?", "4817"),
    ("My sister's name is Marisol.", "What is my sister's name?", "Marisol"),
    ("I parked the car in bay 73.", "In which bay did I park the car?", "73"),
    ("My flight number is KL 1592.", "What is my flight number?", "1592"),
    ("The wifi password is tulip42.", "What is the wifi password?", "tulip42"),
    ("My dog is called Biscuit.", "What is my dog called?", "Biscuit"),
)
TOPICS = ("the moon", "volcanoes", "honey bees", "the Sahara", "glaciers", "octopuses", "the Roman empire", "tea", "comets",
          "rainbows", "the Amazon river", "penguins", "chess", "bamboo", "lightning", "coral reefs", "the piano", "owls",
          "the Great Wall", "salt", "whales", "deserts", "maple trees", "the printing press", "clouds", "tigers", "Jupiter")
PHRASES = ("Tell me one short fact about {}.", "What is one thing people often get wrong about {}?")


def fillers(n: int) -> list[str]:
    return [PHRASES[(i // len(TOPICS)) % len(PHRASES)].format(TOPICS[i % len(TOPICS)]) for i in range(n)]


@dataclass
class Run:
    """One conversation's figures."""

    name: str
    answers: list[str] = field(default_factory=list)
    hits: list[bool] = field(default_factory=list)
    tokens_kept: int | None = None  # what the KV cache holds when the questions come
    shifts: int | None = None
    compactions: list[Compaction] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # compactions that did not happen, and why
    seconds: float | None = None

    @property
    def recall(self) -> int:
        return sum(self.hits)

    def per_compaction(self) -> float | None:
        return statistics.median(c.seconds for c in self.compactions) if self.compactions else None

    def to_dict(self) -> dict:
        return {"recall": self.recall, "of": len(self.hits), "hits": self.hits, "answers": self.answers, "tokens_kept": self.tokens_kept,
                "shifts": self.shifts, "seconds": self.seconds, "seconds_per_compaction_median": self.per_compaction(),
                "compactions": [c.to_dict() for c in self.compactions], "not_compacted": self.refused}


def say(chat: ChatSession, text: str) -> str:
    reply = chat.send(text)
    try:
        return "".join(e.text for e in reply)
    finally:
        reply.close()


def converse(backend: Engine, name: str, turns: list[str], facts: tuple, reply_tokens: int, answer_tokens: int,
             compact_at: float | None) -> Run:
    backend.reset()
    run = Run(name)
    chat = ChatSession(backend, system_prompt=SYSTEM, sampling=SamplingConfig(temperature=0.0, max_tokens=reply_tokens))
    start = time.perf_counter()
    for text in turns:
        say(chat, text)
        if compact_at is not None and should_compact(chat.context_used, chat.n_ctx, compact_at) and compactable(chat.messages, KEEP_TURNS):
            try:
                done = compact(chat)
            except NotCompacted as exc:
                run.refused.append(str(exc))
            else:
                if done is not None:
                    run.compactions.append(done)
    run.seconds = time.perf_counter() - start
    run.tokens_kept, run.shifts = chat.context_used, len(chat.shifts)
    chat.sampling = SamplingConfig(temperature=0.0, max_tokens=answer_tokens)
    for _, question, answer in facts:
        reply = say(chat, question)
        chat.rewind()  # the next question is asked of the same conversation
        run.answers.append(reply.strip())
        run.hits.append(answer in reply)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the lines")
    ap.add_argument("--quick", action="store_true", help="8 turns in 256 tokens, two facts, short replies (CI: checks that it completes, prints its figures)")
    a = ap.parse_args()
    n_ctx, n_turns, facts, reply_tokens, answer_tokens = 2048, 60, FACTS, 48, 24
    if a.quick:  # still past the context: the sliding run shifts once and the compaction run compacts once (the paths CI checks).
        # 256 is the least the load gives; at 7 turns the questions, not the turns, would slide the window
        n_ctx, n_turns, facts, reply_tokens, answer_tokens = 256, 8, FACTS[:2], 16, 8
    turns = [f[0] for f in facts] + fillers(n_turns - len(facts))
    # the one load path (fit, memory check); the context asked is kept: a small model fits it anywhere
    with runtime.open_model(runtime.LoadRequest(model=a.model, options=fitting.LoadOptions(n_ctx=n_ctx, threads=a.threads))) as loaded:
        backend, path = loaded.engine, loaded.planned.path
        n_ctx = backend.n_ctx  # as loaded
        ceiling = converse(backend, "ceiling (facts in the context)", [f[0] for f in facts], facts, reply_tokens, answer_tokens, None)
        sliding = converse(backend, "sliding window", turns, facts, reply_tokens, answer_tokens, None)
        compacted = converse(backend, "compaction", turns, facts, reply_tokens, answer_tokens, COMPACT_AT)
    n = len(facts)
    if a.json:
        print(json.dumps({"model": path.name, "n_ctx": n_ctx, "turns": n_turns, "facts": n, "reply_tokens": reply_tokens, "compact_at": COMPACT_AT,
                          "keep_turns": KEEP_TURNS, "threads": a.threads,
                          "runs": {"ceiling": ceiling.to_dict(), "sliding": sliding.to_dict(), "compaction": compacted.to_dict()}}))
        return 0
    print(f"{path.name}, n_ctx {n_ctx}, {n_turns} turns (facts in the first {n}), replies of at most {reply_tokens} tokens, greedy")
    for run in (ceiling, sliding, compacted):
        print(f"{run.name}: recall {run.recall}/{n} · tokens kept {run.tokens_kept} · shifts {run.shifts} · {run.seconds:.1f} s")
    per = compacted.per_compaction()
    print(f"compactions: {len(compacted.compactions)}"
          + "".join(f"\n  {c.tokens_before:,} → {c.tokens_after:,} tokens in {c.seconds:.2f} s (summary {c.summary_seconds:.2f} s, "
                    f"{c.summarized} messages, summary as a {c.role} message)" for c in compacted.compactions)
          + "".join(f"\n  not compacted: {why}" for why in compacted.refused))
    print("time per compaction, median: " + ("n/a (none ran)" if per is None else f"{per:.2f} s"))
    print("\nfact                    ceiling  sliding  compaction")
    for i, (_, _, answer) in enumerate(facts):
        marks = ["yes" if r.hits[i] else "no" for r in (ceiling, sliding, compacted)]
        print(f"  {answer:<22}{marks[0]:>7}{marks[1]:>9}{marks[2]:>12}")
    if compacted.compactions:
        first = compacted.compactions[0].summary
        print(f"\nthe first summary: {first[:300]}{' …' if len(first) > 300 else ''}")
    print(f"\nrecall of planted facts: sliding window {sliding.recall}/{n}, compaction {compacted.recall}/{n} (ceiling {ceiling.recall}/{n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
