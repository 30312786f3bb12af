"""llama.cpp's own server tests (tools/server/tests of the pinned llama-cpp-python's
vendored llama.cpp) against ``localllm serve`` and against the real llama-server,
with the same model mapping on both sides, so that what one passes and the
other fails is a difference of behaviour, not of model.

    python scripts/peer_server_tests.py [--files test_a.py,test_b.py] [-k EXPR] [--json PATH]
                                        [--sides llama-server,serve] [--workers N] [--one-at-a-time]

What it does:

1. Lays the vendored tests out under ``$XDG_CACHE_HOME/localllm/peer-tests/``
   (never in the repo): ``llama.cpp/tools/server/tests`` is a fresh copy each
   run, ``llama.cpp/models`` and ``llama.cpp/tools/mtmd`` link to the vendored
   ones (the tests read ``../../../models/templates/*.jinja`` and
   ``../../../tools/mtmd/test-1.jpeg``). Three edits to the copy: conftest.py's
   xdist ports start at ``$PEER_PORT_BASE`` instead of 8080 (each side gets
   its own ports; 8080 may be someone else's), conftest.py no longer starts
   every preset once per worker first (``ServerPreset.load_all``: a warm-up
   that only downloads the Hub models, which the mapping replaces; ~30 s a
   side), and utils.py's per-request timeout reads ``$PEER_REQUEST_TIMEOUT``
   (600 s upstream: a hung request would eat the whole budget). A venv of the
   tests' own (``venv/``, made with this repo's python, ``pip install -r
   requirements.txt`` plus pytest-timeout for a per-test bound) is reused
   while those requirements are unchanged.
2. Writes two launchers (``launch-serve``, ``launch-llama-server``): each is
   what ``LLAMA_SERVER_BIN_PATH`` names for one side; they parse the command
   line utils.py's ``ServerProcess.start`` builds and exec the server (the
   launcher's pid is the server's, so the tests' terminate() reaches it).
3. Runs pytest (``-m "not slow"``, ``--junitxml``) once per side, both sides
   at once (llama-server on 1 xdist worker, serve on 2: serve's side takes
   about twice as long; ``--one-at-a-time`` runs them in turn), and prints
   pass counts per file, the totals, and the tests that pass on one side only
   (llama-server's first) with the other side's failure message. Each server
   a test starts without --threads gets ``--threads`` = cores / servers at
   once (1 on 2 cores), on both sides: ggml's threads spin, and 2-thread
   servers sharing 2 cores ran the suite several times slower (one side alone
   past 15 minutes). About 7 minutes on 2 busy cores; logs in
   ``pytest-SIDE.log``, outcomes in ``junit-SIDE.xml``.

Model mapping (both sides alike; the test models come from the Hub, and this
tool is offline):

=============================================  ======================================================
test model (-hf, -hff, -m, --model-url)        model given to both servers
=============================================  ======================================================
bert-bge-small (embeddings)                    SmolLM2 (``localllm list``'s ``smollm2``), plus
                                               ``--pooling mean`` where the test gives no --pooling
                                               (SmolLM2 declares none; bge declares cls, which a
                                               causal model would reduce to its first token)
jina-reranker-v1-tiny (rerank)                 scripts/synth_gguf.py's tiny BERT reranker (cls head,
                                               rank pooling): SmolLM2 has no classification head
tinygemma3 (vision)                            scripts/make_vision_model.py's synthetic gemma3 text
                                               model + gemma3 projector (``--mmproj`` given unless
                                               the test gives --no-mmproj); --mmproj-url is dropped
every other (stories260K, stories15M_MOE,      SmolLM2
infill, split, Phi, Qwen, Llama ...)
--model-draft (speculative tests)              SmolLM2 for llama-server (same vocabulary as the
                                               target); serve has no draft model
LoRA moe_shakespeare15M.gguf (test_lora)       a synthetic LoRA of SmolLM2's shapes, placed where
                                               the test's download_file() finds it (``tmp/``)
no model (router preset)                       none: llama-server's router (its cache is empty
                                               offline); serve's router over ``localllm list``
=============================================  ======================================================

llama-server flag -> ``localllm serve`` (every flag ServerProcess.start can
emit; the llama-server launcher passes all of them through, only the model
flags replaced as above):

=====================================  ==============================================================
llama-server                           serve
=====================================  ==============================================================
--host, --port, --temp, --seed,        the same flag
--alias, --api-key, --metrics,
--slots, --no-slots, --swa-full,
--models-max, --models-preset,
--no-models-autoload, --jinja,
--cors-origins, --slot-save-path,
--lora, --cache-ram, -ctk, -ctv, -fa,
--chat-template, --chat-template-file,
--no-mmproj, --sleep-idle-seconds,
--mcp-servers-config, --mcp-servers-json,
--tools, --threads, --reasoning,
--tags, --verbose, --media-path,
--ui-mcp-proxy
--batch-size / --ubatch-size           --batch / --ubatch
--n-gpu-layers                         --ngl
--n-predict                            -n
--embedding                            --embeddings
--reranking                            --rerank
--offline                              --no-pull
--no-cache-idle-slots                  --cache-ram 0 (idle prompts stay in the KV cache)
--pooling mean|cls|last|rank|none      --pooling (``none``: serve's embedding routes answer 400,
                                       as llama-server's /v1/embeddings)
--reasoning-format auto|deepseek|      --reasoning-format (other values not mapped)
deepseek-legacy|none
--ctx-size N, --parallel P,            --parallel P (4 when not given, llama-server's auto) and
--kv-unified                           --ctx per request as llama-server sizes a slot: N rounded up
                                       to 256 with --kv-unified or no --parallel (llama-server's
                                       auto parallel is unified), else (N rounded up to 256) / P
                                       rounded up to 256 (src/llama-context.cpp n_ctx_seq)
model flags                            ``-m PATH`` as the model mapping above
(always)                               --no-dry-run (saves ~0.4 s per start; the tiny models
                                       need no referee)
=====================================  ==============================================================

Not mapped (the serve launcher logs each on stderr and in ``unmapped.jsonl``
and passes it nowhere):

=====================================  ==============================================================
--cont-batching                        serve always batches continuously (its default)
--kv-unified                           no flag: only changes the --ctx computed above
--grp-attn-n, --grp-attn-w             serve refuses self-extend
--context-shift                        serve does not shift the context (refuses the flag)
--model-draft, --spec-type,            serve has no speculative decoding
--spec-draft-n-min/-max,
--spec-synth-len, --spec-synth-rates
--no-ui                                serve has no web UI (so this is its default)
--no-jinja                             serve always renders Jinja (refuses the flag)
--mmproj-url                           replaced by the vision mapping's local projector
--tools-runtime                        serve starts no container for the tools (a call's x-tool-runtime
                                       header still attaches to a running one, or an ssh host)
--backend_sampling                     no backend sampling in serve
--models-dir                           serve's router serves ``localllm list``
--pooling, other choices               outside serve's choices
=====================================  ==============================================================

Skipped on both sides alike: the tests the vendored suite marks ``slow``
(``-m "not slow"``, as its tests.sh runs by default: they download multi-GB
models), and ``DESELECT`` below: tests that need the Hugging Face Hub itself
(a remote preset, the router's download/delete of a Hub model), which cannot
exist offline. Tests that fetch images from the Hub are kept: they fail
alike. The tests' own ``pytest.skip`` (no container engine, no IPv6) skip
alike too.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
WORK = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "localllm" / "peer-tests"
SUITE = WORK / "llama.cpp" / "tools" / "server" / "tests"
SIDES = ("llama-server", "serve")
PORT_BASE = {"llama-server": 18400, "serve": 18500}  # conftest adds 10 a worker
EXTRA_REQUIREMENTS = ["pytest-timeout~=2.3"]  # a per-test bound: a hung stream has no timeout in utils.py

# Tests needing the Hub itself (not just a model we can map): skipped on both sides.
DESELECT = {
    "unit/test_router.py::test_router_remote_preset": "a preset repo on the Hub (ggml-org/test-preset-ci)",
    "unit/test_router.py::test_router_download_model": "the router downloads a Hub model",
    "unit/test_router.py::test_router_delete_model": "deletes the Hub model the download test fetched",
}

# --- the launchers: llama-server's command line (utils.py ServerProcess.start) --------------------

VALUELESS = frozenset({
    "--offline", "--cont-batching", "--embedding", "--reranking", "--metrics", "--kv-unified", "--swa-full", "--slots",
    "--no-slots", "--verbose", "--context-shift", "--no-ui", "--no-models-autoload", "--jinja", "--no-jinja", "--no-mmproj",
    "--no-cache-idle-slots", "--ui-mcp-proxy", "--backend_sampling",
})
MODEL_FLAGS = frozenset({"-m", "--model", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"})
DRAFT_FLAGS = frozenset({"-md", "--model-draft"})
# test model (a substring of its repo/file) -> role; anything else is a text model
ROLES = (("bert-bge-small", "embedding"), ("jina-reranker", "reranker"), ("tinygemma3", "vision"))

SAME = {f: f for f in (
    "--host", "--port", "--temp", "--seed", "--alias", "--api-key", "--metrics", "--slots", "--no-slots", "--swa-full",
    "--models-max", "--models-preset", "--no-models-autoload", "--jinja", "--cors-origins", "--slot-save-path", "--lora",
    "--cache-ram", "-ctk", "-ctv", "-fa", "--chat-template", "--chat-template-file", "--no-mmproj", "--sleep-idle-seconds",
    "--mcp-servers-config", "--mcp-servers-json", "--tools", "--threads", "--reasoning", "--pooling", "--reasoning-format",
    "--tags", "--verbose", "--media-path", "--ui-mcp-proxy")}
RENAMED = {"--batch-size": "--batch", "--ubatch-size": "--ubatch", "--n-gpu-layers": "--ngl", "--n-predict": "-n",
           "--embedding": "--embeddings", "--reranking": "--rerank", "--offline": "--no-pull"}
CHOICES = {"--pooling": {"mean", "cls", "last", "rank", "none"}, "--reasoning-format": {"auto", "deepseek", "deepseek-legacy", "none"},
           "--reasoning": {"on", "off", "auto"}}
CTX_FLAGS = frozenset({"--ctx-size", "-c", "--parallel", "-np", "--kv-unified"})
NOT_MAPPED = {
    "--cont-batching": "serve always batches continuously (its default)",
    "--grp-attn-n": "serve refuses self-extend", "--grp-attn-w": "serve refuses self-extend",
    "--context-shift": "serve does not shift the context",
    "--model-draft": "serve has no speculative decoding", "--spec-type": "serve has no speculative decoding",
    "--spec-draft-n-min": "serve has no speculative decoding", "--spec-draft-n-max": "serve has no speculative decoding",
    "--spec-synth-len": "serve has no speculative decoding", "--spec-synth-rates": "serve has no speculative decoding",
    "--no-ui": "serve has no web UI (its default)",
    "--no-jinja": "serve always renders Jinja",
    "--mmproj-url": "replaced by the vision mapping's local projector",
    "--tools-runtime": "serve starts no container for the tools (x-tool-runtime still attaches to a running one)",
    "--backend_sampling": "no backend sampling in serve",
    "--models-dir": "serve's router serves localllm list",
}


def parse_flags(argv: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs; the arity comes from VALUELESS because values such
    as ``--seed -1`` look like flags, and ServerProcess only emits known ones."""
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in VALUELESS or i + 1 >= len(argv):
            pairs.append((flag, None))
            i += 1
        else:
            pairs.append((flag, argv[i + 1]))
            i += 2
    return pairs


def model_role(pairs: list[tuple[str, str | None]]) -> str | None:
    """The test model's role from its repo/file names, None when no model is
    given (the router preset)."""
    names = " ".join(v or "" for f, v in pairs if f in MODEL_FLAGS)
    if not names.strip():
        return None
    return next((role for key, role in ROLES if key in names), "text")


def model_args(role: str | None, pairs: list[tuple[str, str | None]], models: dict[str, str]) -> list[str]:
    """The mapped model for either server (see the docstring's model table)."""
    if role is None:
        return []
    given = {f for f, _ in pairs}
    out = ["-m", models[role]]
    if role == "vision" and "--no-mmproj" not in given:
        out += ["--mmproj", models["mmproj"]]
    if role == "embedding" and "--pooling" not in given:
        out += ["--pooling", "mean"]
    return out


def _pad256(n: int) -> int:
    return -(-n // 256) * 256


def ctx_args(pairs: list[tuple[str, str | None]]) -> list[str]:
    """serve's --parallel and per-request --ctx from llama-server's total
    --ctx-size: a llama-server slot gets n_ctx / n_parallel (both rounded up to
    256) unless the cache is unified (--kv-unified, or -np not given: auto
    parallel is 4 slots on a unified cache, tools/server/server.cpp)."""
    values = {f: v for f, v in pairs}
    parallel = values.get("--parallel") or values.get("-np")
    unified = "--kv-unified" in values or parallel is None
    out = ["--parallel", str(parallel or 4)]
    n_ctx = values.get("--ctx-size") or values.get("-c")
    if n_ctx and int(n_ctx) > 0:
        total = _pad256(int(n_ctx))
        out += ["--ctx", str(total if unified else _pad256(total // int(parallel)))]
    return out


def serve_flag(flag: str, value: str | None) -> tuple[list[str], str | None]:
    """One llama-server flag as serve's argv words, or ([], why not mapped)."""
    if flag in CHOICES and value not in CHOICES[flag]:
        return [], f"{value!r} is outside serve's choices"
    if flag == "--no-cache-idle-slots":
        return ["--cache-ram", "0"], None
    target = SAME.get(flag) or RENAMED.get(flag)
    if target is None:
        return [], NOT_MAPPED.get(flag, "unknown to this launcher")
    return [target] + ([value] if value is not None else []), None


def serve_argv(pairs: list[tuple[str, str | None]], cfg: dict) -> tuple[list[str], list[tuple[str, str | None, str]]]:
    """serve's command line for llama-server's, and the flags left out (why)."""
    out = [cfg["python"], "-m", "localllm", "serve", "--no-dry-run"]
    dropped: list[tuple[str, str | None, str]] = []
    for flag, value in pairs:
        if flag in MODEL_FLAGS or flag in CTX_FLAGS:
            continue  # model_args and ctx_args below
        words, why = serve_flag(flag, value)
        out += words
        if why:
            dropped.append((flag, value, why))
    return out + ctx_args(pairs) + model_args(model_role(pairs), pairs, cfg["models"]) + thread_args(pairs, cfg), dropped


def llama_argv(pairs: list[tuple[str, str | None]], cfg: dict) -> list[str]:
    """The real llama-server with the same flags, only the models swapped."""
    out = [cfg["llama_server"]]
    for flag, value in pairs:
        if flag in MODEL_FLAGS or flag in ("--mmproj-url", "-mmu"):
            continue
        if flag in DRAFT_FLAGS:
            value = cfg["models"]["draft"]
        out += [flag] + ([value] if value is not None else [])
    return out + model_args(model_role(pairs), pairs, cfg["models"]) + thread_args(pairs, cfg)


def thread_args(pairs: list[tuple[str, str | None]], cfg: dict) -> list[str]:
    """--threads for a server the test gives none: the cores shared among the
    workers, because ggml's threads spin and two servers of two threads each on
    two cores run many times slower than of one each."""
    given = any(f in ("--threads", "-t") for f, _ in pairs)
    return [] if given or not cfg.get("threads") else ["--threads", str(cfg["threads"])]


def launch(side: str, config: str) -> None:
    """The launchers' entry point: map sys.argv and exec the server in place."""
    cfg = json.loads(Path(config).read_text())
    pairs = parse_flags(sys.argv[1:])
    if side == "serve":
        argv, dropped = serve_argv(pairs, cfg)
        with open(cfg["unmapped_log"], "a") as log:
            for flag, value, why in dropped:
                print(f"peer launcher: not mapped for serve: {flag} {value or ''} ({why})", file=sys.stderr)
                log.write(json.dumps({"flag": flag, "value": value, "why": why}) + "\n")
    else:
        argv = llama_argv(pairs, cfg)
    print("peer launcher: " + " ".join(argv), file=sys.stderr, flush=True)
    os.execv(argv[0], argv)


# --- laying out the suite -----------------------------------------------------------------------


def vendored() -> Path:
    """The vendored llama.cpp of the pinned wheel (build_llama_tools.sh decides where)."""
    sys.path.insert(0, str(REPO))
    from scripts import llama_tools

    return llama_tools.source_dir()


def _patch(path: Path, old: str, new: str) -> None:
    """Edit the copied suite, loudly: a vendored file that changed shape must not
    silently run with 8080 ports or 600 s request timeouts."""
    text = path.read_text()
    if old not in text:
        raise SystemExit(f"{path}: {old!r} not found; the vendored tests changed, update peer_server_tests.py")
    path.write_text(text.replace(old, new))


def lay_out(src: Path) -> None:
    """A fresh copy of the tests, and links for the paths they reach outside it."""
    root = WORK / "llama.cpp"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(src / "tools" / "server" / "tests", SUITE)
    (root / "models").symlink_to(src / "models")
    (root / "tools" / "mtmd").symlink_to(src / "tools" / "mtmd")
    (SUITE / "tmp").mkdir()
    _patch(SUITE / "conftest.py", "8080 + worker_num * 10", "int(os.environ.get('PEER_PORT_BASE', '8080')) + worker_num * 10")
    _patch(SUITE / "conftest.py", "        ServerPreset.load_all()", "        pass  # peer_server_tests: no preload, the models are local")
    _patch(SUITE / "utils.py", "DEFAULT_REQUEST_TIMEOUT = 600", "DEFAULT_REQUEST_TIMEOUT = int(os.environ.get('PEER_REQUEST_TIMEOUT', '600'))")


def ensure_venv() -> Path:
    """The tests' venv, rebuilt only when their requirements change (pip from the registry)."""
    venv, req = WORK / "venv", SUITE / "requirements.txt"
    stamp = hashlib.sha256((req.read_text() + "\n".join(EXTRA_REQUIREMENTS)).encode()).hexdigest()
    py, mark = venv / "bin" / "python", venv / ".peer-requirements"
    if py.exists() and mark.exists() and mark.read_text() == stamp:
        return py
    subprocess.run([str(PYTHON), "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "-r", str(req), *EXTRA_REQUIREMENTS], check=True)
    mark.write_text(stamp)
    return py


def smollm2() -> str:
    """The shipped SmolLM2's path, as localllm itself lists it."""
    out = subprocess.run([str(PYTHON), "-m", "localllm", "list", "--json"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    return next(m["path"] for m in json.loads(out) if m["name"] == "smollm2")


def synth_models(text: str) -> dict[str, str]:
    """The reranker, vision pair and LoRA the mapping needs, written once (seeded: the same every time)."""
    sys.path.insert(0, str(REPO))
    from scripts.make_vision_model import write_vision_model
    from scripts.synth_gguf import write_lora_gguf, write_reranker_gguf
    from scripts.synth_spec import SynthSpec

    d = WORK / "models"
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "reranker.gguf").exists():
        write_reranker_gguf(d / "reranker.gguf")
    if not (d / "vision" / "mmproj-model.gguf").exists():
        write_vision_model(d / "vision")
    lora = d / "smollm2-lora.gguf"
    if not lora.exists():  # SmolLM2-135M's shapes (llama: 30 layers, 576 wide, 9/3 heads, ff 1536)
        write_lora_gguf(lora, SynthSpec(n_layer=30, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, name="smollm2"), weight_scale=0.05)
    return {"text": text, "embedding": text, "draft": text, "reranker": str(d / "reranker.gguf"),
            "vision": str(d / "vision" / "model.gguf"), "mmproj": str(d / "vision" / "mmproj-model.gguf"), "lora": str(lora)}


def place_downloads(models: dict[str, str]) -> None:
    """Where utils.download_file() looks first (tmp/NAME): the draft (test_speculative)
    and the LoRA (test_lora) it would fetch from the Hub."""
    (SUITE / "tmp" / "stories15M-q4_0.gguf").symlink_to(models["draft"])
    (SUITE / "tmp" / "moe_shakespeare15M.gguf").symlink_to(models["lora"])


def write_launchers(models: dict[str, str], threads: int) -> dict[str, Path]:
    """One executable stub a side (LLAMA_SERVER_BIN_PATH), calling launch() above."""
    sys.path.insert(0, str(REPO))
    from scripts import llama_tools

    cfg = {"python": str(PYTHON), "llama_server": str(llama_tools.require("llama-server")), "models": models, "threads": threads,
           "unmapped_log": str(WORK / "unmapped.jsonl")}
    (WORK / "launch.json").write_text(json.dumps(cfg, indent=1))
    paths = {}
    for side in SIDES:
        p = WORK / f"launch-{side}"
        p.write_text(f"#!{PYTHON}\nimport sys\nsys.path.insert(0, {str(REPO)!r})\n"
                     f"from scripts.peer_server_tests import launch\nlaunch({side!r}, {str(WORK / 'launch.json')!r})\n")
        p.chmod(0o755)
        paths[side] = p
    return paths


# --- running and reading the outcomes -----------------------------------------------------------


def side_workers(side: str, args: argparse.Namespace) -> int:
    """pytest-xdist workers for one side: --workers, else 2, or when both sides
    run at once 1 for llama-server and 2 for serve (serve's side takes about
    twice as long: a serve start costs ~1 s of CPU, llama-server's ~0.4 s), so
    that both end together and 3 servers share the cores."""
    if args.workers:
        return args.workers
    return 2 if args.one_at_a_time or len(args.sides.split(",")) == 1 else {"llama-server": 1}.get(side, 2)


def pytest_argv(py: Path, side: str, args: argparse.Namespace) -> list[str]:
    """The pytest command for one side: not slow, the DESELECT list, junit XML."""
    files = [f"unit/{f.strip()}" for f in args.files.split(",")] if args.files else ["unit"]
    argv = [str(py), "-m", "pytest", *files, "-m", "not slow", "-p", "no:cacheprovider", "-q", "-rN",
            f"--junitxml={WORK / f'junit-{side}.xml'}", f"--timeout={args.test_timeout}", "--durations=30"]
    argv += [f"--deselect={node}" for node in DESELECT]
    workers = side_workers(side, args)
    if workers > 1:
        argv += ["-n", str(workers), "--dist=worksteal"]
    if args.k:
        argv += ["-k", args.k]
    return argv


def start_side(py: Path, side: str, launcher: Path, args: argparse.Namespace) -> subprocess.Popen:
    """One pytest session against one side, output to pytest-SIDE.log; in a
    session of its own so that a timeout can end its workers and servers too."""
    env = {**os.environ, "LLAMA_SERVER_BIN_PATH": str(launcher), "PEER_PORT_BASE": str(PORT_BASE[side]),
           "PORT": str(PORT_BASE[side]), "PEER_REQUEST_TIMEOUT": str(args.request_timeout)}
    env.pop("DEBUG", None)
    (WORK / f"junit-{side}.xml").unlink(missing_ok=True)
    with open(WORK / f"pytest-{side}.log", "w") as log:
        return subprocess.Popen(pytest_argv(py, side, args), cwd=SUITE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_sides(procs: dict[str, subprocess.Popen], timeout: float) -> dict[str, float]:
    """Each side's wall time; a side past ``timeout`` has its process group
    killed (its junit XML is then missing and the side reads as empty)."""
    t0, walls = time.monotonic(), {}
    while len(walls) < len(procs):
        for side, proc in procs.items():
            if side not in walls and proc.poll() is not None:
                walls[side] = time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            for side, proc in procs.items():
                if side not in walls:
                    print(f"{side}: past --side-timeout, killed", file=sys.stderr)
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    walls[side] = time.monotonic() - t0
        time.sleep(0.5)
    return walls


def run_sides(py: Path, launchers: dict[str, Path], args: argparse.Namespace) -> dict[str, float]:
    """Both sides at once (default: each leaves the cores idle while servers
    start and tests wait), or one after the other with --one-at-a-time."""
    sides = args.sides.split(",")
    groups = [[s] for s in sides] if args.one_at_a_time else [sides]
    walls: dict[str, float] = {}
    for group in groups:
        for side in group:
            print(f"{side}: running the vendored server tests ({WORK / f'pytest-{side}.log'})", flush=True)
        walls.update(wait_sides({side: start_side(py, side, launchers[side], args) for side in group}, args.side_timeout))
    return walls


def node_id(case: ET.Element) -> str:
    """pytest's node id from junit's classname (unit.test_x[.Class]) and name."""
    parts = case.get("classname", "").split(".")
    i = next((k for k, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    return "/".join(parts[: i + 1]) + ".py::" + "::".join([*parts[i + 1:], case.get("name", "")])


def read_junit(path: Path) -> dict[str, dict[str, str]]:
    """Each test's outcome (passed, failed, error, skipped) and first message line."""
    out: dict[str, dict[str, str]] = {}
    if not path.exists():
        return out
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (el.get("message") or (el.text or "")).strip().splitlines()[0][:300] if (el.get("message") or el.text) else ""
                break
        out[node_id(case)] = {"outcome": outcome, "message": message}
    return out


def unmapped_counts() -> dict[str, int]:
    """How often each flag was left out by the serve launcher (a flag a server start)."""
    log = WORK / "unmapped.jsonl"
    if not log.exists():
        return {}
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return dict(Counter(f"{r['flag']} {r['value'] or ''}".strip() if r["flag"] in CHOICES else r["flag"] for r in rows).most_common())


def per_file(results: dict[str, dict[str, dict[str, str]]]) -> list[tuple[str, dict[str, int], int]]:
    """(file, passes a side, tests) rows; the test count is the union of both sides'."""
    files = sorted({n.split("::")[0] for side in results.values() for n in side})
    rows = []
    for f in files:
        nodes = {n for side in results.values() for n in side if n.split("::")[0] == f}
        passes = {s: sum(1 for n in nodes if results[s].get(n, {}).get("outcome") == "passed") for s in results}
        rows.append((f.removeprefix("unit/"), passes, len(nodes)))
    return rows


def print_report(results: dict[str, dict[str, dict[str, str]]], walls: dict[str, float]) -> None:
    """The per-file table, totals, one-side-only lists and the unmapped flags."""
    sides = list(results)
    print(f"\n{'file':34}" + "".join(f"{s:>14}" for s in sides) + f"{'tests':>7}")
    for f, passes, n in per_file(results):
        print(f"{f:34}" + "".join(f"{passes[s]:>14}" for s in sides) + f"{n:>7}")
    total = len({n for side in results.values() for n in side})
    print(f"{'TOTAL passed':34}" + "".join(f"{sum(o['outcome'] == 'passed' for o in results[s].values()):>14}" for s in sides) + f"{total:>7}")
    print(f"{'skipped':34}" + "".join(f"{sum(o['outcome'] == 'skipped' for o in results[s].values()):>14}" for s in sides))
    print("wall: " + ", ".join(f"{s} {walls[s]:.0f} s" for s in walls))
    if len(sides) == 2:
        for a, b in (("llama-server", "serve"), ("serve", "llama-server")):
            only = [n for n in sorted(results[a]) if results[a][n]["outcome"] == "passed" and results[b].get(n, {}).get("outcome") != "passed"]
            print(f"\npassed by {a} only ({len(only)}):")
            for n in only:
                o = results[b].get(n, {"outcome": "absent", "message": ""})
                print(f"  {n}  [{o['outcome']}] {o['message'][:160]}")
    print("\nflags the serve launcher did not map (times seen): " + (", ".join(f"{f} x{c}" for f, c in unmapped_counts().items()) or "none"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", default="", help="comma-separated test files of unit/ (default: all)")
    ap.add_argument("-k", default="", help="pytest's -k, passed through")
    ap.add_argument("--json", default="", metavar="PATH", help="write each test's outcome, both sides, here")
    ap.add_argument("--sides", default=",".join(SIDES), help="llama-server,serve (default: both)")
    ap.add_argument("--workers", type=int, default=0, help="pytest-xdist workers a side (default: 1 llama-server, 2 serve; 1: serial)")
    ap.add_argument("--one-at-a-time", action="store_true", help="run the sides one after the other, not at once")
    ap.add_argument("--threads", type=int, default=0, help="--threads for each server whose test sets none (default: cores / workers)")
    ap.add_argument("--test-timeout", type=int, default=60, help="seconds a test may take (pytest-timeout)")
    ap.add_argument("--request-timeout", type=int, default=60, help="utils.py's per-request timeout")
    ap.add_argument("--side-timeout", type=int, default=900, help="seconds the sessions may take (each, with --one-at-a-time)")
    args = ap.parse_args()
    src = vendored()
    lay_out(src)
    py = ensure_venv()
    models = synth_models(smollm2())
    place_downloads(models)
    sides = args.sides.split(",")
    servers_at_once = max(side_workers(s, args) for s in sides) if args.one_at_a_time else sum(side_workers(s, args) for s in sides)
    launchers = write_launchers(models, args.threads or max(1, (os.cpu_count() or 1) // servers_at_once))
    (WORK / "unmapped.jsonl").unlink(missing_ok=True)
    walls = run_sides(py, launchers, args)
    results = {side: read_junit(WORK / f"junit-{side}.xml") for side in args.sides.split(",")}
    print_report(results, walls)
    if args.json:
        Path(args.json).write_text(json.dumps({"sides": results, "wall_s": walls, "unmapped": unmapped_counts(),
                                               "deselected": DESELECT, "vendored": str(src)}, indent=1))


if __name__ == "__main__":
    main()
