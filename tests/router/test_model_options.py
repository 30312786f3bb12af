"""Each model's own options in router mode (issue 46): the config file's
``[models."NAME"]`` tables and a llama-server presets INI (``--models-preset``)
reach that model's fit and its child's command line, under what was typed; the
config's default model is loaded at start and kept while idle."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.cli import _parse, build_parser, subparsers
from localllm.commands import preset_ini, serve_flags
from localllm.commands.serve import child_options
from localllm.commands.serve_models import PerModel, preset_of
from localllm.errors import UsageError
from localllm.router.children import Spawn
from tests.helpers import router as rt
from tests.helpers.paths import REPO
from tests.helpers.server import http_client

CONFIG = """
ctx = 1024
temp = 0.5
[serve]
parallel = 2
[models."gemma3-270m"]
ctx = 512
kv-type = "q8_0"
"""

PRESET = """
version = 1
; llama-server's spelling: long names, short names, switches
[*]
c = 768
top-k = 30

[SmolLM2]
ctx-size = 640
n-gpu-layers = 0
metrics = true
"""


def per_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *typed: str, config: str = CONFIG, preset: str | None = PRESET) -> PerModel:
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    monkeypatch.setenv("LOCALLLM_CONFIG", str(cfg))
    argv = ["serve", *typed]
    if preset is not None:
        ini = tmp_path / "models.ini"
        ini.write_text(preset)
        argv += ["--models-preset", str(ini)]
    parser = build_parser()
    args = _parse(parser, argv)
    args.subparsers = subparsers(parser)
    return PerModel(args, preset_of(args.models_preset, args.subparsers["serve"], serve_flags.refused()))


def test_typed_beats_the_preset_section_which_beats_star_which_beats_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    per = per_model(tmp_path, monkeypatch, "--top-k", "7")
    smol, gemma, other = per.args("smollm2"), per.args("gemma3-270m"), per.args("tiny")
    assert (smol.ctx, smol.ngl, smol.metrics) == (640, 0, True)  # its section (the name's case does not matter)
    assert (gemma.ctx, gemma.kv_type) == (768, "q8_0")  # [*]'s c over its config table's ctx; the table's kv-type stays
    assert other.ctx == 768 and other.temp == 0.5 and other.parallel == 2  # [*], the config's top level and [serve]
    assert {a.top_k for a in (smol, gemma, other)} == {7}  # typed wins over [*]
    assert per.args("smollm2") is smol  # parsed once per model
    spawn = Spawn(head=("serve",), options=(), key="k", config="none", per_model=lambda n: tuple(child_options(per.args(n))))
    argv = spawn.argv("smollm2", Path("/m/smollm2.gguf"))
    assert "--ctx=640" in argv and "--metrics" in argv and "--top-k=7" in argv and "--parallel=2" in argv


def test_the_config_tables_alone_and_typed_over_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    per = per_model(tmp_path, monkeypatch, "--ctx", "300", preset=None)
    assert per.args("gemma3-270m").ctx == 300 and per.args("gemma3-270m").kv_type == "q8_0"
    per = per_model(tmp_path, monkeypatch, preset=None)
    assert per.args("gemma3-270m").ctx == 512 and per.args("smollm2").ctx == 1024


@pytest.mark.parametrize(("text", "says"), [
    ("[*]\nmlock = true\n", "'mlock' is not an option serve takes"),  # refused by serve, so by a preset too
    ("[*]\nflux-capacitor = 1\n", "'flux-capacitor' is not an option serve takes"),
    ("[qwen]\nmodel = /tmp/q.gguf\n", "'model' is not read here"),
    ("[qwen]\nhf = a/b\n", "'hf' is not read here"),
    ("[qwen]\nport = 9\n", "'port' is the server's, not a model's"),
    ("ctx-size = 9\n", "'ctx-size' before any section"),
    ("[*]\nload-on-startup = true\n", "load-on-startup names one model"),
    ("[qwen]\nload-on-startup = maybe\n", "give true or false"),
    ("[qwen]\nctx-size = many\n", "ctx-size = 'many'"),
    ("[qwen]\nkv-type = q3_9\n", "choose one of"),
    ("[qwen\n", "not a presets INI"),
    ("[a]\nc = 1\n[a]\nc = 2\n", "not a presets INI"),
])
def test_a_bad_preset_is_one_line_naming_the_file_and_the_key(tmp_path: Path, text: str, says: str) -> None:
    ini = tmp_path / "bad.ini"
    ini.write_text(text)
    with pytest.raises(UsageError) as caught:
        preset_ini.read(ini, subparsers(build_parser())["serve"], serve_flags.refused())
    message = str(caught.value)
    assert says in message and str(ini) in message and "\n" not in message, message


PARAMS_RUN = "[*]\nmlock = true\n"


def test_the_command_line_refuses_a_bad_preset_and_a_preset_with_a_model(tmp_path: Path) -> None:
    env = {**os.environ, **rt.isolated_env(tmp_path)}
    for text, argv, says in ((PARAMS_RUN, [], "'mlock' is not an option serve takes"), ("[*]\nc = 64\n", ["smollm2"], "give it without a MODEL"),
                             ("[../../etc/passwd]\nc = 64\n", [], "[../../etc/passwd] names no model of localllm list")):  # issue 64
        ini = tmp_path / "p.ini"
        ini.write_text(text)
        r = subprocess.run([sys.executable, "-m", "localllm", "serve", *argv, "--models-preset", str(ini), "--port", "0"], capture_output=True,
                           text=True, cwd=REPO, env=env, timeout=60)
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    (tmp_path / "fifo.ini").unlink(missing_ok=True)
    os.mkfifo(tmp_path / "fifo.ini")  # never opened: a FIFO would block the read
    r = subprocess.run([sys.executable, "-m", "localllm", "serve", "--models-preset", str(tmp_path / "fifo.ini"), "--port", "0"],
                       capture_output=True, text=True, cwd=REPO, env=env, timeout=60)
    assert r.returncode == 2 and "not a regular file" in r.stderr, r.stderr


@pytest.mark.slow
def test_the_default_model_loads_at_start_and_stays_and_each_child_gets_its_own_options(tmp_path: Path, smollm2: Path) -> None:
    env = rt.isolated_env(tmp_path)
    tiny = rt.copy_of(smollm2, tmp_path / "models", "tiny.gguf")
    rt.add(env, tiny)
    Path(env["LOCALLLM_CONFIG"]).write_text('model = "smollm2"\nctx = 256\n[models."tiny"]\nctx = 384\n')
    ini = tmp_path / "models.ini"
    ini.write_text("[smollm2]\nctx-size = 320\n")
    server = rt.Server("--api-key", rt.KEY, "--parallel", "1", "--threads", "1", "--keep-alive", "1s", "--models-preset", str(ini), env=env)
    try:
        with http_client(server) as h:
            def status() -> dict[str, str]:
                return {m["id"]: m["status"]["value"] for m in h.get("/models").json()["data"]}

            assert rt.wait_for(lambda: status().get("smollm2") == "loaded", timeout=60)  # no request named it
            assert h.get("/props", params={"model": "smollm2"}).json()["default_generation_settings"]["n_ctx"] == 320
            r = h.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 1})
            assert r.status_code == 200, r.text
            assert h.get("/props", params={"model": "tiny"}).json()["default_generation_settings"]["n_ctx"] == 384
            ps = {m["name"].removesuffix(":latest"): m for m in h.get("/api/ps").json()["models"]}
            assert ps["tiny"]["context_length"] == 384 and ps["smollm2"]["context_length"] == 320  # the router's fit used them too
            assert ps["smollm2"]["expires_at"] is None
            rt.wait_for(lambda: status().get("tiny") != "loaded", timeout=30)  # --keep-alive 1s unloads the other
            assert status()["smollm2"] == "loaded"  # kept while idle
    finally:
        server.stop()
