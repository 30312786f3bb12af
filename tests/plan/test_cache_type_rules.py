"""One rule for cache types, with llama.cpp as the referee: for each case the
rule's verdict is compared with what llama.cpp does when our check is skipped,
in a child process (it aborts on some). ``plan`` refuses what llama.cpp refuses,
auto-fit never picks such a type, and ``run`` accepts what llama.cpp accepts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.engine_api import LoadConfig
from localllm.modelfile.gguf_file import read_header
from localllm.plan import planner
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.paths import REPO

# Load with our check switched off, decode 4 tokens: "OK", "REFUSED <reason>", or a crash.
_PROBE = """
import sys
from pathlib import Path
import localllm.plan.planner as planner
planner.check_cache_types = lambda *a, **k: None
from localllm.engine import LlamaCppBackend
from localllm.engine_api import EngineError, LoadConfig, SamplingConfig
path, tk, tv, fa = sys.argv[1:]
b = LlamaCppBackend()
try:
    b.load(Path(path), LoadConfig(n_ctx=256, type_k=tk, type_v=tv, flash_attn=fa, n_threads=1))
    b.stream("hello world", SamplingConfig(temperature=0, max_tokens=4), chat=False).drain()
    print("OK")
except EngineError as e:
    print("REFUSED", e)
"""


@pytest.fixture(scope="module")
def head80(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Head size 80 (as Phi-2 and StableLM 3B) with one and with two KV heads."""
    d = tmp_path_factory.mktemp("h80")
    return {kv: write_llama_gguf(d / f"h80-kv{kv}.gguf", SynthSpec(n_embd=160, n_head=2, n_head_kv=kv, n_ff=320)) for kv in (1, 2)}


CASES = [  # (KV heads, K, V, flash attention)
    (1, "q4_0", "f16", "off"),  # K row 80: llama.cpp aborts in ggml_view_2d
    (2, "q4_0", "f16", "off"),  # K row 160: loads and decodes
    (2, "q8_0", "q8_0", "on"),  # block 32 does not divide 80: refused
    (2, "q8_0", "f16", "auto"),  # auto checks as on does
    (2, "f16", "q4_0", "on"),
    (1, "f16", "f16", "off"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_the_rule_agrees_with_llama_cpp(head80: dict[int, Path], case: tuple[int, str, str, str]) -> None:
    kv, tk, tv, fa = case
    path = head80[kv]
    shape = planner.ModelShape.from_header(read_header(path))
    ours = planner.cache_types_allowed(shape, LoadConfig(type_k=tk, type_v=tv, flash_attn=fa))
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path), tk, tv, fa], capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    llama_ok = out.returncode == 0 and out.stdout.strip() == "OK"
    assert ours == llama_ok, (case, out.returncode, out.stdout[-300:], out.stderr[-300:])


@pytest.mark.slow
def test_plan_refuses_what_llama_cpp_refuses(head80: dict[int, Path]) -> None:
    r = cli("plan", str(head80[2]), "--kv-type", "q8_0", "--flash-attn", "on")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "K cache type q8_0 stores blocks of 32 values but this model's K head dim is 80: use --kv-type f16" in r.stderr


@pytest.mark.slow
def test_auto_fit_never_picks_a_refused_type(tmp_path: Path) -> None:
    """A budget where f16 does not hold the asked context but q8_0 does: a head
    size of 64 gets q8_0; a head size of 80, for which llama.cpp refuses q8_0 with
    flash attention, keeps f16 and gets a smaller context instead."""
    chosen = {}
    for head, embd in ((64, 128), (80, 160)):
        path = write_llama_gguf(tmp_path / f"h{head}.gguf", SynthSpec(n_embd=embd, n_head=2, n_head_kv=2, n_ff=320, n_ctx_train=65536))
        r = cli("plan", str(path), "--ctx", "65536", "--vram", "260MiB", "--ngl", "99", "--json")
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)
        chosen[head] = (plan["type_k"], plan["n_ctx"], sorted(plan["max_ctx_by_kv_type"]))
    assert chosen[64] == ("q8_0", 65536, ["f16", "q4_0", "q8_0"])
    assert chosen[80][0] == "f16" and chosen[80][1] < 65536 and chosen[80][2] == ["f16"]


@pytest.mark.slow
def test_run_accepts_a_quantized_k_that_llama_cpp_accepts(head80: dict[int, Path]) -> None:
    r = cli("run", str(head80[2]), "--raw", "-p", "hello", "-n", "3", "--temp", "0", "--k-type", "q4_0", "--v-type", "f16",
            "--flash-attn", "off", "--ctx", "256", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["generated_tokens"] == 3
