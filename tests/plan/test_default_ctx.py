"""The context a server asks for when the user names none (issue 59, item 3):
the trained one, as llama-server's ``-c 0``, then fitted to the device; ``run``
keeps at most 4096. Decided in one place (``fitting.default_ctx``) and said
with its reason (``fitting.context_choice``) by serve's start line, ``plan``
and ``/api/ps``. Pure planning on Gemma 3 270M's header: milliseconds."""

from __future__ import annotations

import argparse
from pathlib import Path

from localllm import cli
from localllm.engine_api import LoadConfig
from localllm.plan import fitting, prepare
from localllm.plan.hardware import Hardware

TRAINED = 32768  # Gemma 3 270M's context_length


def _fit(path: Path, n_ctx: int, ram: int, n_seq: int = 1) -> fitting.Fit:
    hw = Hardware(None, None, None, "none", ram, ram)
    return prepare.prepare_load(path, fitting.Request(LoadConfig(n_ctx=n_ctx, n_seq=n_seq)), hw, n_ctx=n_ctx, n_seq=n_seq, dry_run=None).fit


def test_a_server_asks_for_the_trained_context_and_run_for_at_most_4096() -> None:
    assert fitting.default_ctx(32768, serving=True) == 32768
    assert fitting.default_ctx(32768) == 4096
    assert fitting.default_ctx(2048, serving=True) == fitting.default_ctx(2048) == 2048
    assert fitting.default_ctx(None, serving=True) == fitting.default_ctx(None) == fitting.DEFAULT_CTX


def test_the_trained_context_when_it_fits_else_the_largest_that_does(gemma: Path) -> None:
    roomy = _fit(gemma, TRAINED * 4, ram=64 * 2**30, n_seq=4)
    assert roomy.config.n_ctx == TRAINED * 4
    assert fitting.context_why(roomy, 4, default=True) == "32768 (trained)"
    assert fitting.context_choice(roomy, 4).to_dict() == {"n_ctx": 32768, "asked": 32768, "trained": 32768, "why": "trained",
                                                          "text": "32768 (trained)"}
    # the same four sequences on a machine with about 450 MiB: the pool shrinks, parallel counted
    tight = _fit(gemma, TRAINED * 4, ram=450 * 2**20, n_seq=4)
    assert tight.fits and tight.config.n_ctx < TRAINED * 4
    per = tight.config.n_ctx // 4
    assert fitting.context_why(tight, 4, default=True) == f"{per} (largest that fits; trained 32768)"
    assert fitting.context_choice(tight, 4).why == "fitted"
    one = _fit(gemma, TRAINED, ram=450 * 2**20)  # one sequence gets more of the same memory
    assert one.config.n_ctx > per
    assert _fit(gemma, TRAINED * 4, ram=one.plan.total_cpu_bytes, n_seq=4).config.n_ctx < one.config.n_ctx


def test_a_default_context_gives_way_before_the_cache_type(gemma: Path) -> None:
    """As llama.cpp's fit shrinks an unset context first and never changes a
    cache type (common/fit.cpp, step 2): on 650 MiB, four sequences of Gemma 3's
    trained context hold at f16 only shrunk (22,592 tokens each), and the same
    context named is kept with a q8_0 cache instead."""
    hw = Hardware(None, None, None, "none", 650 * 2**20, 650 * 2**20)

    def fit(n_ctx: int | None) -> fitting.Fit:
        return prepare.prepare_load(gemma, fitting.Request(LoadConfig()), hw, n_ctx=n_ctx, n_seq=4, dry_run=None, serving=True).fit

    default, named = fit(None), fit(TRAINED * 4)
    assert (default.config.type_k, default.config.n_ctx) == ("f16", 90368) and default.asked.n_ctx == TRAINED * 4
    assert fitting.context_why(default, 4, default=True) == "22592 (largest that fits; trained 32768)"
    assert (named.config.type_k, named.config.n_ctx) == ("q8_0", TRAINED * 4)
    # where f16 cannot hold the floor (4096 a sequence), q8_0 holds more than it: the default is not cut to nothing
    low = Hardware(None, None, None, "none", 340 * 2**20, 340 * 2**20)
    tight = prepare.prepare_load(gemma, fitting.Request(LoadConfig()), low, n_seq=4, dry_run=None, serving=True).fit
    assert tight.fits and tight.config.n_ctx >= 4096 * 4 and tight.config.type_k == "q8_0", tight.config


def test_each_reason_in_words(gemma: Path) -> None:
    roomy = 64 * 2**30
    assert fitting.context_why(_fit(gemma, 4096, roomy), default=True) == "4096 (run's default, at most 4096; trained 32768)"
    assert fitting.context_why(_fit(gemma, 2048, roomy)) == "2048 (as asked; trained 32768)"
    assert fitting.context_why(_fit(gemma, 65536, roomy)) == "65536 (as asked; beyond the trained 32768)"
    over = _fit(gemma, 65536 * 4, ram=450 * 2**20, n_seq=4)
    assert str(fitting.context_why(over, 4)).endswith("(largest that fits; asked 65536, trained 32768)")
    no_trained = fitting.ContextChoice(4096, 4096, None, "default")
    assert str(no_trained) == "4096 (default; the model names no trained context)"


def test_the_router_plans_each_model_with_it(gemma: Path) -> None:
    """The router's memory plan (``serve._memory``, what residency counts) asks
    what ``serve MODEL`` asks: the trained context for each of ``--parallel``
    sequences, the largest that fits a budget too small for it."""
    from localllm.commands import serve
    from localllm.commands.serve_models import PerModel
    from localllm.router import residency

    def plan(*flags: str):
        parser = cli.build_parser()
        args = parser.parse_args(["serve", *flags])
        args.subparsers = cli.subparsers(parser)
        memory = serve._memory(serve.Options.from_args(args), residency, PerModel(args, None))
        return memory.plan(gemma)

    lp = plan()
    assert lp.config.n_ctx == TRAINED * 4 and lp.config.n_seq == 4
    assert fitting.context_why(lp.fit, 4) == "32768 (trained)"
    lp = plan("--parallel", "2")
    assert lp.config.n_ctx == TRAINED * 2 and lp.config.n_seq == 2
    lp = plan("--vram", "500MiB")  # a simulated GPU: the layers stay on it, the context gives way
    assert lp.fit.fits and lp.config.n_ctx < TRAINED * 4 and lp.fit.gpu_layers == lp.fit.n_layers
    assert fitting.context_why(lp.fit, 4) == f"{lp.config.n_ctx // 4} (largest that fits; trained 32768)"
    lp = plan("--ctx", "1024")
    assert lp.config.n_ctx == 4096 and fitting.context_why(lp.fit, 4) == "1024 (as asked; trained 32768)"


def test_serve_says_its_default_in_help() -> None:
    serve = cli.subparsers(cli.build_parser())["serve"]
    ctx = next(a for a in serve._actions if "--ctx" in a.option_strings)  # noqa: SLF001 - argparse's own list
    assert ctx.default is None and "trained context" in (ctx.help or "")
    assert isinstance(serve.parse_args([]), argparse.Namespace) and serve.get_default("parallel") == 4
