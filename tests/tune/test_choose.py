"""The choice rule: the fastest request time wins over the incumbent only by more
than the margin, and only where the plan and the quality bound allow it."""

from __future__ import annotations

from localllm.cli import build_parser
from localllm.commands.config_file import _options
from localllm.tune import section
from localllm.tune.candidates import FLASH_ATTN, KV_TYPE, THREADS, UBATCH, Setting, stage, thread_values, ubatch_values, values
from localllm.tune.choose import MARGIN, REPLY_TOKENS, Result, Run, eligible, winner

BASE = Setting(ubatch=512, flash_attn="on", kv_type="f16", threads=2)


def result(s: Setting, pp: float, tg: float, *, runs: int = 2, **kw) -> Result:
    return Result(s, runs=[Run({128: pp}, {128: tg}) for _ in range(runs)], **kw)


def test_request_time_weighs_a_prompt_and_a_reply() -> None:
    r = result(BASE, 1000.0, 50.0)
    assert r.request_s() == 128 / 1000 + REPLY_TOKENS / 50


def test_figures_are_the_best_of_the_runs() -> None:
    """Another program only slows a run down: the best run is the one it touched least."""
    r = Result(BASE, runs=[Run({128: 100.0}, {128: 10.0}), Run({128: 300.0}, {128: 30.0}), Run({128: 200.0}, {128: None})])
    assert r.prefill() == {128: 300.0} and r.decode() == {128: 30.0}
    assert Result(BASE).request_s() is None and Result(BASE).to_dict()["prefill_tokens_per_s"] is None  # not measured: null, never 0


def test_a_challenger_must_beat_the_margin() -> None:
    inc = result(BASE, 1000.0, 50.0)
    close = result(BASE.with_value(UBATCH, 256), 1000.0, 50.0 * (1 + MARGIN / 2))
    clear = result(BASE.with_value(UBATCH, 128), 1000.0, 50.0 * 1.2)
    assert winner([inc, close]) is inc
    assert winner([inc, close, clear]) is clear


def test_the_fastest_of_several_challengers_wins() -> None:
    inc = result(BASE, 1000.0, 50.0)
    a = result(BASE.with_value(UBATCH, 256), 1000.0, 60.0)
    b = result(BASE.with_value(UBATCH, 128), 1000.0, 70.0)
    assert winner([inc, b, a]) is b and winner([inc, a, b]) is b


def test_what_the_plan_or_the_quality_bound_refuses_cannot_win() -> None:
    inc = result(BASE, 1000.0, 50.0, reference=True)
    no_fit = result(BASE.with_value(KV_TYPE, "q8_0"), 2000.0, 90.0, fits=False, why_not="context 2048 instead of 4096")
    lossy = result(BASE.with_value(KV_TYPE, "q4_0"), 2000.0, 90.0, kl_mean=0.2)
    unknown = result(BASE.with_value(KV_TYPE, "q8_0"), 2000.0, 90.0)
    assert winner([inc, no_fit]) is inc and "does not fit: context 2048" in (eligible(no_fit, 0.01) or "")
    assert winner([inc, lossy]) is inc and eligible(lossy, 0.01) == "KL 0.2000 over 0.01"
    assert winner([inc, unknown]) is inc and eligible(unknown, 0.01) == "quality not measured"
    fine = result(BASE.with_value(KV_TYPE, "q8_0"), 2000.0, 90.0, kl_mean=0.004)
    assert winner([inc, fine]) is fine
    assert winner([inc, lossy], max_kl=0.5) is lossy  # --max-kl


def test_an_unmeasured_incumbent_stays() -> None:
    """Interrupted before the incumbent ran: nothing says another is faster."""
    assert winner([Result(BASE), result(BASE.with_value(UBATCH, 128), 1000.0, 90.0)]).setting == BASE


def test_candidates() -> None:
    assert ubatch_values(4096, quick=False) == [128, 256, 512] and ubatch_values(4096, quick=True) == [128, 512]
    assert ubatch_values(200, quick=False) == [128, 200] and ubatch_values(100, quick=False) == [100]
    assert thread_values(8, quick=False) == [8, 7, 4] and thread_values(8, quick=True) == [8, 4]
    assert thread_values(2, quick=False) == [2, 1] and thread_values(2, quick=True) == [2, 1] and thread_values(1, quick=False) == [1]
    assert values(KV_TYPE, quick=True, ubatch_cap=512, start_threads=2) == ["f16", "q8_0"]
    assert values(FLASH_ATTN, quick=False, ubatch_cap=512, start_threads=2) == ["on", "off"]
    # the incumbent first; a quantized cache turns flash attention on (llama.cpp needs it for the V cache)
    off = Setting(512, "off", "f16", 2)
    got = stage(KV_TYPE, off, ["f16", "q8_0", "q4_0"])
    assert got == [off, Setting(512, "on", "q8_0", 2), Setting(512, "on", "q4_0", 2)]
    assert stage(THREADS, BASE, [2, 1]) == [BASE, Setting(512, "on", "f16", 1)]


def test_the_keys_tune_writes_are_flags_of_the_loading_commands() -> None:
    """A key the config file takes is a flag name: tune's keys, and every alias it reads, are flags of run, chat, serve and the cockpit."""
    subs = {a.dest: a for a in build_parser()._actions if a.dest == "command"}["command"].choices  # type: ignore[attr-defined]
    for command in ("run", "chat", "serve", "tui", "plan"):
        opts = _options(subs[command])
        assert all(name in opts for names in section.ALIASES.values() for name in names), command
