"""util.lean_import: the engine loads llama-cpp-python's low-level half only (the
high-level half was 190 ms of every model-loading process's start), the header
reader gguf's constants only (80 ms), and a program that uses the rest of either
beside localllm still gets it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO


def _in_a_fresh_interpreter(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_engine_loads_the_bindings_alone_and_the_rest_comes_on_first_use() -> None:
    d = _in_a_fresh_interpreter(
        "import importlib.metadata, json, sys\n"
        "import localllm.engine, llama_cpp\n"
        "out = {'high_at_import': 'llama_cpp.llama' in sys.modules, 'version': llama_cpp.__version__,\n"
        "       'installed': importlib.metadata.version('llama_cpp_python'), 'decode': callable(llama_cpp.llama_decode)}\n"
        "from llama_cpp import mtmd_cpp, llama_grammar\n"
        "out['high_after_submodules'] = 'llama_cpp.llama' in sys.modules\n"
        "from llama_cpp import Llama, LlamaGrammar\n"
        "out['llama'] = Llama.__module__\n"
        "try:\n"
        "    llama_cpp.no_such_name\n"
        "except AttributeError as exc:\n"
        "    out['missing'] = str(exc)\n"
        "print(json.dumps(out))\n")
    assert d["high_at_import"] is False and d["high_after_submodules"] is False and d["decode"] is True
    assert d["version"] == d["installed"]
    assert d["llama"] == "llama_cpp.llama" and "no_such_name" in d["missing"]


@pytest.mark.slow
def test_a_program_that_imported_llama_cpp_first_keeps_its_package() -> None:
    d = _in_a_fresh_interpreter(
        "import json, llama_cpp\n"
        "before = llama_cpp\n"
        "import localllm.engine\n"
        "import llama_cpp as after\n"
        "print(json.dumps({'same': before is after, 'has_llama': hasattr(after, 'Llama')}))\n")
    assert d == {"same": True, "has_llama": True}


@pytest.mark.slow
def test_gguf_is_read_for_its_constants_and_its_writer_comes_on_first_use(tmp_path) -> None:
    """The synthetic models are written with gguf's own writer after localllm read its constants."""
    d = _in_a_fresh_interpreter(
        "import json, sys\n"
        "from pathlib import Path\n"
        "import localllm.plan.planner, localllm.modelfile.gguf_file\n"
        "out = {'writer_at_import': 'gguf.gguf_writer' in sys.modules}\n"
        "from scripts.synth_gguf import SynthSpec, write_llama_gguf\n"
        f"path = write_llama_gguf(Path({str(tmp_path / 'x.gguf')!r}), SynthSpec())\n"
        "from localllm.modelfile.gguf_file import read_header\n"
        "out['blocks'] = read_header(path).get('llama.block_count')\n"
        "out['writer_after'] = 'gguf.gguf_writer' in sys.modules\n"
        "print(json.dumps(out))\n")
    assert d == {"writer_at_import": False, "blocks": 2, "writer_after": True}
