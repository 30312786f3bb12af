"""Issue 16: absurd options and headers, damaged state files, hostile chat
templates, interrupted quantization, and errors that belong to their cause.
Every test here drives the real CLI (child processes) or the real engine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from localllm.commands.advice import cli_message
from scripts.fuzz_gguf import ARR, STR, U32, _replace_kv, _with_tensor, enc, enc_array, parse, serialize
from tests.conftest import REPO, run_cli


def _one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _mutated(synth: Path, tmp_path: Path, name: str, change) -> Path:  # type: ignore[no-untyped-def]
    m = change(parse(synth))
    out = tmp_path / name
    out.write_bytes(serialize(m))
    return out


# -- 2. options llama.cpp would assert on ---------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--ctx", "1", "--batch", "1"], ["--batch", "1"], ["--ctx", "1"], ["--batch", "2", "--ubatch", "64"]])
def test_tiny_context_and_batch_do_not_reach_llama_asserts(synth_model: Path, extra: list[str]) -> None:
    """--ctx 1 --batch 1 aborted in GGML_ASSERT(n_tokens_all <= cparams.n_batch):
    the prompt was sent in chunks of 2. Now no chunk is larger than the batch."""
    proc = run_cli("run", str(synth_model), "--raw", "-p", "the cat sat on the mat", "-n", "3", "--temp", "0", "--json", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    assert d["generated_tokens"] == 3 and d["prompt_tokens"] > 2


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--threads", "100000"], "--threads must be at most"),
        (["--ctx", "99999999999"], "--ctx must be at most"),
        (["--batch", "4294967297"], "--batch must be at most"),
        (["--ngl", "99999999999"], "--ngl must be at most"),
        (["--temp", "inf"], "finite"),
        (["--seed", "99999999999"], "--seed must be at most"),
        (["--draft-k", "100000"], "--draft-k must be at most"),
    ],
)
def test_absurd_options_are_usage_errors(synth_model: Path, args: list[str], needle: str) -> None:
    _one_line(run_cli("run", str(synth_model), "-p", "x", *args), 2, needle)


def test_engine_refuses_absurd_configs_from_any_caller(synth_model: Path) -> None:
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api.records import LoadConfig
    from localllm.errors import UsageError

    for cfg in (LoadConfig(n_ctx=256, n_threads=10**6), LoadConfig(n_ctx=1 << 40), LoadConfig(n_ctx=256, n_batch=0)):
        with LlamaCppBackend() as b, pytest.raises(UsageError):
            b.load(synth_model, cfg)


# -- 2. header values bounded before any per-layer work ------------------------------


@pytest.mark.slow
def test_zero_layers_is_one_line_everywhere(synth_model: Path, tmp_path: Path) -> None:
    """block_count 0 aborted llama.cpp (GGML_ASSERT(n_layer_all > 0))."""
    f = _mutated(synth_model, tmp_path, "zero.gguf", lambda m: _replace_kv(m, "block_count", U32, enc(U32, 0)))
    for cmd in (["inspect"], ["plan"], ["run", "--raw", "-p", "hi"]):
        _one_line(run_cli(cmd[0], str(f), *cmd[1:], timeout=60), 1, str(f), "at least one layer")


@pytest.mark.slow
def test_absurd_layer_count_is_refused_at_once(synth_model: Path, tmp_path: Path) -> None:
    """2^31 layers in a small header made plan build per-layer lists for hours."""
    f = _mutated(synth_model, tmp_path, "huge.gguf", lambda m: _replace_kv(m, "block_count", U32, enc(U32, 1 << 31)))
    t0 = time.perf_counter()
    _one_line(run_cli("plan", str(f), timeout=60), 1, str(f), "block_count")
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize(
    "name, change, needle",
    [
        ("short-array", lambda m: _replace_kv(m, "attention.head_count_kv", ARR, enc_array(U32, [2])), "has 1 entries for 2 layers"),
        ("bad-tensor-name", lambda m: _with_tensor(m, 1, name=b"blk.x.attn_q.weight"), "no layer number"),
        ("experts", lambda m: _replace_kv(m, "expert_used_count", U32, enc(U32, 2), add=True), "expert_used_count"),
        ("rope", lambda m: _replace_kv(m, "rope.scaling.type", STR, enc(STR, "bogus"), add=True), "rope.scaling.type"),
        ("wrong-type", lambda m: _replace_kv(m, "embedding_length", STR, enc(STR, "sixty-four")), "embedding_length is a string"),
    ],
)
@pytest.mark.slow
def test_model_file_problems_name_the_file(synth_model: Path, tmp_path: Path, name: str, change, needle: str) -> None:  # type: ignore[no-untyped-def]
    """These were an internal error (IndexError, ValueError) or a llama.cpp abort."""
    f = _mutated(synth_model, tmp_path, f"{name}.gguf", change)
    for cmd in (["plan"], ["run", "--raw", "-p", "hi", "-n", "2"]):
        _one_line(run_cli(cmd[0], str(f), *cmd[1:], timeout=60), 1, str(f), needle)
    proc = run_cli("list", env={"LOCALLLM_LMSTUDIO_DIR": str(tmp_path)})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr
    assert any(f"{name}" in row and "unreadable" in row for row in proc.stdout.splitlines()), proc.stdout


# -- 3. state files checked before use -----------------------------------------------


def test_state_file_format_detects_damage() -> None:
    from localllm.engine import StateFileError, pack_state, unpack_state

    meta = {"build": "b", "model": {"path": "/m", "size": 1, "mtime_ns": 2}, "cache": {}}
    raw = pack_state(meta, [1, 2, 3], b"payload-bytes")
    assert unpack_state(raw) == (meta, [1, 2, 3], b"payload-bytes")
    damaged = {
        "truncated": raw[: len(raw) // 2],
        "flipped": raw[:-40] + bytes([raw[-40] ^ 1]) + raw[-39:],
        "tampered count": raw.replace(b"[1,2,3]", b"[1,2,9]"),
        "old format": b"GGSQ" + raw[4:],
        "empty": b"",
    }
    for what, bad in damaged.items():
        with pytest.raises(StateFileError):
            unpack_state(bad)
        assert what


def _chat(model: Path, system: str, text: str = "Hi") -> subprocess.CompletedProcess[str]:
    return run_cli("chat", str(model), "--system", system, "-n", "4", "--temp", "0", "--json", "--ctx", "512", stdin=text + "\n")


@pytest.mark.slow
def test_damaged_prompt_cache_is_deleted_and_rebuilt(smollm2: Path) -> None:
    """A damaged state file aborted chat on every start, and one with tampered
    numbers loaded as a hit and gave empty replies. Now each is deleted and
    rebuilt with a one-line notice, and the reply is the same as before."""
    from localllm.chat.session import prompt_cache_path

    system = "You are a terse assistant. Answer in one word."
    first = _chat(smollm2, system)
    assert first.returncode == 0, first.stderr[-2000:]
    cache = prompt_cache_path(smollm2, system, "f16", "f16", False)
    assert cache.exists()
    assert json.loads(_chat(smollm2, system).stdout)["prompt_cache_hit"] is True

    def tamper(raw: bytes) -> bytes:
        start = raw.index(b'"tokens":[') + 10
        return raw[:start] + b"9" + raw[start + 1 :]

    damages = {
        "truncated": lambda raw: raw[: len(raw) // 3],
        "a flipped byte": lambda raw: raw[: len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 0xFF]) + raw[len(raw) // 2 + 1 :],
        "tampered token numbers": tamper,
        "llama.cpp's own format (what localllm wrote before)": lambda raw: b"GGSQ" + raw[4:],
    }
    for what, damage in damages.items():
        cache.write_bytes(damage(cache.read_bytes()))
        proc = _chat(smollm2, system)
        assert proc.returncode == 0, (what, proc.stderr[-2000:])
        turn = json.loads(proc.stdout)
        assert turn["prompt_cache_hit"] is False and turn["reply"] == json.loads(first.stdout)["reply"], what
        notes = [line for line in proc.stderr.splitlines() if "prompt cache" in line]
        assert len(notes) == 1 and "deleted, rebuilding it" in notes[0], (what, proc.stderr)
    assert json.loads(_chat(smollm2, system).stdout)["prompt_cache_hit"] is True  # rebuilt, and good again


@pytest.mark.slow
def test_registry_of_the_wrong_shape(tmp_path: Path, synth_model: Path, _isolated_home: Path) -> None:
    reg = _isolated_home / "registry.json"
    reg.parent.mkdir(parents=True, exist_ok=True)
    reg.write_text("[1, 2, 3]")
    _one_line(run_cli("add", str(synth_model)), 1, "not a localllm registry")
    assert reg.read_text() == "[1, 2, 3]"  # add wrote nothing before failing
    reg.write_text(json.dumps({"added": ["/nowhere.gguf", 7, None], "pulled": [{"repo_id": "a/b"}, "junk", {"repo_id": "a/b", "filename": "x.gguf"}]}))
    proc = run_cli("add", str(synth_model), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "skipped 4 malformed entries" in proc.stderr and "Traceback" not in proc.stderr
    data = json.loads(reg.read_text())
    assert data["added"] == ["/nowhere.gguf", str(synth_model.resolve())]
    assert [p["filename"] for p in data["pulled"]] == ["x.gguf"] and data["pulled"][0]["stored"] is True
    assert run_cli("list").returncode == 0


@pytest.mark.slow
def test_eight_adds_at_once_lose_nothing(tmp_path: Path, synth_model: Path, _isolated_home: Path) -> None:
    files = []
    for i in range(8):
        f = tmp_path / f"model-{i}.gguf"
        f.write_bytes(synth_model.read_bytes())
        files.append(f)
    procs = [subprocess.Popen([sys.executable, "-m", "localllm", "add", str(f)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for f in files]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    data = json.loads((_isolated_home / "registry.json").read_text())
    assert sorted(data["added"]) == sorted(str(f.resolve()) for f in files)
    assert not list(_isolated_home.glob(".registry.json.tmp-*"))


def test_saved_sessions_are_checked(_isolated_home: Path) -> None:
    from localllm.chat import sessions
    from localllm.errors import InputError

    d = _isolated_home / "sessions"
    d.mkdir(parents=True)
    (d / "good.json").write_text(json.dumps({"id": "good", "model": "smollm2", "messages": [{"role": "user", "content": "hello"}]}))
    (d / "no-content.json").write_text(json.dumps({"id": "nc", "model": "smollm2", "messages": [{"role": "user"}]}))
    (d / "list.json").write_text("[]")
    (d / "binary.json").write_bytes(b"\xff\xfe{")
    (d / "bad-messages.json").write_text(json.dumps({"id": "bm", "model": "m", "messages": "hi"}))
    skipped: list[str] = []
    got = sessions.list_sessions(on_skip=lambda p, why: skipped.append(p.name))
    assert [s.id for s in got] == ["good"] and got[0].title == "hello" and got[0].settings == {} and got[0].system_prompt is None
    assert sorted(skipped) == ["bad-messages.json", "binary.json", "list.json", "no-content.json"]
    with pytest.raises(InputError, match="message 1 has no role or no content"):
        sessions.load("no-content")
    with pytest.raises(InputError):
        sessions.load("../registry")
    assert (d / "no-content.json").exists()  # skipped, never deleted


# -- 4. chat templates with limits ---------------------------------------------------


@pytest.mark.slow
def test_template_limits_in_the_renderer() -> None:
    from localllm.engine.chat_template import ChatTemplate, TemplateError

    msgs = [{"role": "user", "content": "hi"}]
    ok = ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}", "t")
    assert ok.render(msgs, bos_token="", eos_token="", add_generation_prompt=True) == "<user>hi<a>"
    cases = {
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}": "ran for more than",
        "{{ 'x' * 10 ** 100 }}": "too large",
        "{{ 'x' * 10 ** 10 }}": "characters",
        "{{ 'x' * 100000000 }}": "characters",
        "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}": "characters",
        "{{ 'x'|center(1000000000) }}": "past the output limit",
        "{{ raise_exception('no system role') }}": "no system role",
        "{% for %}": "TemplateSyntaxError",
        "{{ ''.__class__.__mro__ }}": "",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}": "RecursionError",
    }
    for source, needle in cases.items():
        t0 = time.perf_counter()
        with pytest.raises(TemplateError) as info:
            ChatTemplate(source, "the test template", seconds=1.0).render(msgs, bos_token="", eos_token="", add_generation_prompt=True)
        # the library names its own settings; the CLI words the same error with its flags
        assert needle in str(info.value) and "use chat=False or use_template(FILE|NAME)" in str(info.value), (source, str(info.value))
        assert "use --raw or --template FILE|NAME" in cli_message(info.value)
        assert time.perf_counter() - t0 < 10, source


@pytest.mark.slow
def test_model_template_that_loops_is_the_models_fault(synth_model: Path, tmp_path: Path) -> None:
    """Rendered without limits, this header's template ran for hours."""
    loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    f = _mutated(synth_model, tmp_path, "loop.gguf", lambda m: _replace_kv(m, "tokenizer.chat_template", STR, enc(STR, loop), add=True))
    _one_line(run_cli("run", str(f), "-p", "hi", "-n", "2", timeout=120), 1, str(f), "the model's chat template failed", "use --raw or --template")
    assert run_cli("run", str(f), "-p", "hi", "-n", "2", "--raw", timeout=120).returncode == 0


@pytest.mark.slow
def test_template_option(synth_model: Path, tmp_path: Path) -> None:
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m.content }} {% endfor %}")
    proc = run_cli("run", str(synth_model), "-p", "the cat", "-n", "2", "--temp", "0", "--template", str(good), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["prompt_tokens"] >= 2
    proc = run_cli("run", str(synth_model), "-p", "the cat", "-n", "2", "--template", "chatml", "--json")
    assert proc.returncode == 0, proc.stderr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{{ 'x' * 10 ** 12 }}")
    _one_line(run_cli("run", str(synth_model), "-p", "hi", "--template", str(bad)), 1, "bad.jinja failed", "use --raw or --template")
    _one_line(run_cli("run", str(synth_model), "-p", "hi", "--template", "no-such-template"), 2, "not a built-in template", "chatml")
    _one_line(run_cli("run", str(synth_model), "-p", "hi", "--raw", "--template", "chatml"), 2, "--raw uses no chat template")


# -- 5. interruptions leave nothing --------------------------------------------------


@pytest.fixture(scope="module")
def f16_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An F16 model big enough that quantizing it with one thread takes a while."""
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    return write_llama_gguf(tmp_path_factory.mktemp("q") / "big-F16.gguf",
                            SynthSpec(n_layer=24, n_embd=512, n_head=8, n_head_kv=8, n_ff=2048, dtype="f16"))


def _start_quantize(src: Path, out: Path) -> tuple[subprocess.Popen[str], int]:
    import psutil

    proc = subprocess.Popen([sys.executable, "-m", "localllm", "quantize", str(src), str(out), "--type", "Q4_K_M", "--threads", "1"],
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stderr is not None
    line = proc.stderr.readline()  # "quantizing: 1/N tensors": the real run has begun
    assert line.startswith("quantizing"), line + proc.stderr.read()
    workers = [c for c in psutil.Process(proc.pid).children() if "localllm.quantize.worker" in " ".join(c.cmdline())]
    assert len(workers) == 1
    return proc, workers[0].pid


def _gone(pid: int, within: float) -> bool:
    import psutil

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_sigkill_of_quantize_stops_its_worker_and_the_next_run_cleans_up(f16_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out-Q4_K_M.gguf"
    proc, worker = _start_quantize(f16_source, out)
    proc.kill()
    proc.wait(timeout=30)
    try:
        assert _gone(worker, 10), "the worker outlived its parent"
    finally:
        if not _gone(worker, 0.1):
            os.kill(worker, signal.SIGKILL)
    stale = list(tmp_path.glob(".out-Q4_K_M.gguf.partial-*"))
    assert len(stale) == 1  # a SIGKILL cannot clean up: the next run must
    other = tmp_path / "other-Q8_0.gguf"
    done = run_cli("quantize", str(f16_source), str(other), "--type", "Q8_0", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-Q8_0.gguf"]


@pytest.mark.slow
def test_sigterm_of_quantize_cleans_up_at_once(f16_source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out-Q4_K_M.gguf"
    proc, worker = _start_quantize(f16_source, out)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=60) == 143, rest
    assert "terminated" in rest and "Traceback" not in rest
    assert _gone(worker, 10)
    assert list(tmp_path.iterdir()) == []


def test_stale_partials_of_live_processes_are_kept(tmp_path: Path) -> None:
    from localllm.quantize.pipeline import remove_stale_partials

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".a.gguf.partial-{dead.pid}").write_bytes(b"x")
    (tmp_path / f".b.gguf.partial-{os.getpid()}").write_bytes(b"x")
    (tmp_path / "keep.gguf").write_bytes(b"x")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / f".c.gguf.partial-{live.pid}").write_bytes(b"x")
        remove_stale_partials(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [f".c.gguf.partial-{live.pid}", "keep.gguf"]
    finally:
        live.kill()
        live.wait()


# -- 6. errors belong to their cause; nothing printed raw ----------------------------


@pytest.mark.slow
def test_invalid_utf8_on_stdin_does_not_end_the_chat(smollm2: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "localllm", "chat", str(smollm2), "-n", "3", "--temp", "0", "--json", "--ctx", "512"],
                          input=b"caf\xe9 \xff\xfe ok\nsecond line\n", capture_output=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    turns = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert [t["user"] for t in turns] == ["caf\ufffd \ufffd\ufffd ok", "second line"]


@pytest.mark.slow
def test_names_paths_and_metadata_are_printed_escaped(synth_model: Path, tmp_path: Path) -> None:
    evil = "evil\x1b[2J\nlocalllm: forged line"
    folder = tmp_path / "models"
    folder.mkdir()
    f = folder / f"{evil}.gguf"
    f.write_bytes(serialize(_replace_kv(parse(synth_model), "general.name", STR, enc(STR, evil.encode()))))
    for args in (["inspect", str(f)], ["add", str(folder)], ["list"]):
        proc = run_cli(*args)
        assert proc.returncode == 0, proc.stderr
        for out in (proc.stdout, proc.stderr):
            assert "\x1b" not in out and "\nlocalllm: forged line" not in out, (args, out)
        assert "evil\\x1b[2J\\nlocalllm: forged line" in proc.stdout + proc.stderr, args
    # an error that names the path: still one line
    _one_line(run_cli("inspect", str(tmp_path / f"{evil}-missing.gguf")), 1, "evil\\x1b[2J\\n")
    proc = run_cli("inspect", str(f), "--json")
    assert json.loads(proc.stdout)["name"] == evil  # JSON escapes on its own


def test_fmt_safe() -> None:
    from localllm.util.fmt import safe, table

    assert safe("plain name: q4_k_m") == "plain name: q4_k_m"
    assert safe("a\nb\tc\x1b[0m\x7f\u202e\x00") == "a\\nb\\tc\\x1b[0m\\x7f\\u202e\\x00"
    assert safe("caf\udce9") == "caf\\udce9"  # an undecodable byte of a file name
    assert "\n" not in table(("A", "B"), [("x\ny", "z\r")]).splitlines()[1]



@pytest.mark.slow
def test_a_huge_name_from_a_damaged_length_stays_one_short_line(synth_model: Path, tmp_path: Path) -> None:
    """A damaged length field made a tensor "name" of megabytes, which the error
    message quoted whole (74 MB for SmolLM2: inspect took minutes)."""
    f = _mutated(synth_model, tmp_path, "long.gguf", lambda m: _with_tensor(m, 1, name=b"blk.0." + b"\x01" * 8_000_000))
    line = _one_line(run_cli("inspect", str(f), timeout=60), 1, str(f), "longer than 63 bytes")
    assert len(line) < 600  # the path, the first 60 characters of the name, the reason
