"""Load options have one shape (``fitting.LoadOptions``) from the CLI's flags
and the cockpit's settings to the engine: the same choices made either way ask
the fitting service the same question."""

from __future__ import annotations

import pytest

from localllm.cli import build_parser
from localllm.commands._common import fit_request, load_options
from localllm.flags import Load, Lora
from localllm.plan import fitting
from localllm.tui.settings import Settings


@pytest.mark.parametrize(("flags", "settings"), [
    (["--ctx", "2048", "--kv-type", "q8_0", "--ngl", "5", "--threads", "2", "--flash-attn", "on", "--ubatch", "256",
      "--batch", "1024", "--policy", "offload", "--swa-full"],
     Settings(n_ctx=2048, type_k="q8_0", type_v="q8_0", n_gpu_layers=5, threads=2, flash_attn="on", n_ubatch=256, n_batch=1024,
              policy="offload", swa_full=True)),
    (["--ctx", "1024", "--k-type", "q4_0", "--v-type", "q8_0"],  # a quantized V turns flash attention on, both ways
     Settings(n_ctx=1024, type_k="q4_0", type_v="q8_0")),
])
def test_flags_and_settings_ask_the_same(flags: list[str], settings: Settings) -> None:
    args = build_parser().parse_args(["run", *flags])
    load = Load.from_args(args)
    assert load_options(load, load.ctx) == settings.load_options()
    assert fit_request(load, Lora.from_args(args), load.ctx) == settings.fit_request()


def test_what_was_not_given_is_left_to_the_fit() -> None:
    req = load_options(Load.from_args(build_parser().parse_args(["run"])), 4096).request()
    assert not req.kv_fixed and not req.ngl_fixed and req.config.type_k == "f16" and req.config.n_gpu_layers == -1
    assert req == fitting.LoadOptions(n_ctx=4096).request()
