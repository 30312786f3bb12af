"""``run --image``/``--mmproj`` and chat's ``/image`` end to end, on the synthetic vision model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers.cli import cli
from tests.vision.conftest import noise_png

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pictures(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("pictures")
    a, b = d / "a.png", d / "b.png"
    a.write_bytes(noise_png(1))
    b.write_bytes(noise_png(2))
    return a, b


def _run(model: Path, *extra: str):
    return cli("run", str(model), "-p", "what is it?", "-n", "2", "--temp", "0", "--ctx", "256", "--threads", "1", "--json", *extra)


def test_run_image_with_and_without_mmproj_flag(vision_model, pictures) -> None:
    model, proj = vision_model
    given = _run(model, "--image", str(pictures[0]), "--mmproj", str(proj))
    assert given.returncode == 0, given.stderr
    out = json.loads(given.stdout)
    assert out["images"] == 1 and out["encode_ms"] > 0 and out["images_per_s"] > 0
    assert out["prompt_tokens"] >= 4  # the image's 4 tokens count in the prompt
    found = _run(model, "--image", str(pictures[0]))  # the projector beside the model, as -hf finds it
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout)["images"] == 1
    plain = _run(model, "--no-mmproj")
    assert plain.returncode == 0, plain.stderr
    assert json.loads(plain.stdout)["encode_ms"] is None  # n/a without an image, never 0


def test_run_stats_block_shows_the_encode_phase(vision_model, pictures) -> None:
    model, _ = vision_model
    r = cli("run", str(model), "-p", "hi", "-n", "2", "--temp", "0", "--ctx", "256", "--threads", "1", "--image", str(pictures[0]), "--image", str(pictures[1]))
    assert r.returncode == 0, r.stderr
    assert "image encode:         2 image(s)" in r.stderr and "images/s" in r.stderr
    assert "vision: projector mmproj-model.gguf (gemma3, images at 32 px, 4 tokens an image)" in r.stderr


@pytest.mark.parametrize("case", ["projector_as_model", "fifo", "no_projector", "svg", "ubatch"])
def test_bad_input_is_one_line(vision_model, tmp_path: Path, case: str) -> None:
    model, proj = vision_model
    if case == "projector_as_model":
        r = _run(proj, "--mmproj", str(proj))
        want = "is a projector (mmproj), not a model"
    elif case == "fifo":
        os.mkfifo(tmp_path / "pipe.png")
        r = _run(model, "--image", str(tmp_path / "pipe.png"))
        want = "not a regular file"
    elif case == "no_projector":
        r = _run(model, "--no-mmproj", "--image", str(tmp_path / "x.png"))
        want = "no such file"  # the image is read first
        (tmp_path / "x.png").write_bytes(noise_png(1))
        r = _run(model, "--no-mmproj", "--image", str(tmp_path / "x.png"))
        want = "--image needs a vision model"
    elif case == "ubatch":  # Gemma 3's image tokens attend both ways: one ubatch must hold them, or llama.cpp aborts
        (tmp_path / "x.png").write_bytes(noise_png(1))
        r = _run(model, "--image", str(tmp_path / "x.png"), "--ubatch", "2")
        want = "an image here is 4 tokens, decoded whole, but --ubatch is 2"
    else:
        (tmp_path / "d.svg").write_text("<svg xmlns='http://www.w3.org/2000/svg'/>")
        r = _run(model, "--image", str(tmp_path / "d.svg"))
        want = "is an SVG"
    assert r.returncode != 0
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("localllm: vision: ")]
    assert len(lines) == 1 and lines[0].startswith("localllm: error: ") and want in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_chat_image_then_a_follow_up_encodes_nothing_again(vision_model, pictures) -> None:
    model, proj = vision_model
    script = f"/image {pictures[0]}\nwhat is it?\nand the colours?\n/image /nowhere.png\nstill there?\n"
    # the projector named with llama.cpp's short flag (found beside the model otherwise: test_run_image_with_and_without_mmproj_flag)
    r = cli("chat", str(model), "-mm", str(proj), "--template", "chatml", "-n", "2", "--temp", "0", "--ctx", "512", "--threads", "1", "--json",
            stdin=script)
    assert r.returncode == 0, r.stderr
    turns = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [t["images"] for t in turns] == [1, 0, 0]
    assert turns[0]["encode_ms"] > 0 and turns[1]["encode_ms"] is None and turns[2]["encode_ms"] is None
    # the cache was kept: each follow-up read only its own tokens, the image stayed in the cache
    assert turns[1]["prompt_tokens"] < turns[0]["context_used"] < turns[1]["context_used"]
    assert turns[2]["prompt_tokens"] < turns[1]["context_used"] < turns[2]["context_used"]
    assert "localllm: error: image /nowhere.png: no such file" in r.stderr  # one line, and the chat went on


def test_a_wrong_projector_found_beside_leaves_the_model_text_only(tmp_path: Path, pictures) -> None:
    from scripts.make_vision_model import ProjectorSpec, write_projector
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    model = write_llama_gguf(tmp_path / "text.gguf", SynthSpec())
    write_projector(tmp_path / "mmproj-other.gguf", ProjectorSpec(n_embd_text=32))  # another model's, in a shared folder
    plain = cli("run", str(model), "-p", "hi", "-n", "1", "--ctx", "256", "--threads", "1", "--no-stats")
    assert plain.returncode == 0, plain.stderr
    assert "not using the projector beside the model" in plain.stderr and "text only" in plain.stderr
    with_image = cli("run", str(model), "-p", "hi", "-n", "1", "--ctx", "256", "--threads", "1", "--image", str(pictures[0]))
    assert with_image.returncode != 0 and "--image needs a vision model" in with_image.stderr
    given = cli("run", str(model), "-p", "hi", "-n", "1", "--ctx", "256", "--mmproj", str(tmp_path / "mmproj-other.gguf"))
    assert given.returncode != 0 and "does not fit model text.gguf" in given.stderr  # named: an error


def test_inspect_shows_the_projector(vision_model) -> None:
    model, proj = vision_model
    text = cli("inspect", str(model))
    assert text.returncode == 0, text.stderr
    assert "projector         mmproj-model.gguf (gemma3" in text.stdout and "tokens per image  4" in text.stdout
    as_json = json.loads(cli("inspect", str(model), "--json").stdout)["projector"]
    assert (as_json["projector_type"], as_json["image_size"], as_json["tokens_per_image"], as_json["n_embd_out"]) == ("gemma3", 32, 4, 64)
    alone = cli("inspect", str(proj))  # the projector itself: what it is, and that it is not a model
    assert alone.returncode == 0 and "a projector (mmproj) is not a model" in alone.stdout and "image size        32 px" in alone.stdout


def test_run_verbose_and_json_carry_the_projector_memory(vision_model, pictures) -> None:
    model, _ = vision_model
    r = cli("-v", "run", str(model), "-p", "hi", "-n", "1", "--ctx", "256", "--threads", "1", "--no-stats", "--image", str(pictures[0]))
    assert r.returncode == 0, r.stderr
    assert "projector memory: weights 0.05 MiB on the CPU (from its tensors), logged 0.05 MiB on CPU" in r.stderr
    out = json.loads(_run(model, "--image", str(pictures[0])).stdout)["projector"]
    assert out["memory"]["planned"]["weights_bytes"] == out["weight_bytes"]
    assert out["memory"]["logged"]["device"] == "CPU" and out["memory"]["logged"]["compute_bytes"]["CPU"] > 0


def test_plan_counts_the_projector_where_clip_puts_it(vision_model) -> None:
    import gguf

    model, proj = vision_model
    tensors = sum(int(t.n_bytes) for t in gguf.GGUFReader(proj).tensors)  # what clip.cpp logs as "model size"
    out = cli("plan", str(model), "--ctx", "256", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)["projector"]
    assert d["memory"]["device"] == "CPU" and d["memory"]["weights_bytes"] == tensors
    assert d["memory"]["compute_bytes"] > 0 and "estimate" in d["memory"]["compute_source"] and d["fits"] is True
    text = cli("plan", str(model), "--ctx", "256")
    assert "projector weights" in text.stdout and "projector compute (estimate)" in text.stdout
    assert f"projector {proj.name}: " in text.stdout and "fits with" in text.stdout
    assert "projector" not in cli("plan", str(model), "--ctx", "256", "--no-mmproj").stdout
    # a GPU budget too small for it: clip.cpp would put it on the GPU; one line says the shortfall, exit non-zero
    short = cli("plan", str(model), "--ctx", "256", "--vram", "64M")
    assert short.returncode != 0 and "does not fit:" in short.stdout.splitlines()[-1]
    assert json.loads(cli("plan", str(model), "--ctx", "256", "--vram", "64M", "--json").stdout)["projector"]["fits"] is False


def test_bench_image_times_the_encoder_on_every_repetition(vision_model, pictures) -> None:
    model, _ = vision_model
    args = ("bench", str(model), "--prompt-tokens", "16", "--gen-tokens", "2", "--reps", "2", "--threads", "1")
    out = cli(*args, "--image", str(pictures[0]), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    image = rows[-1]
    assert image["case"] == "image" and image["images"] == 1 and image["reps"] == 2
    # encoded on each repetition (a kept encoding would leave encode_ms null): both measured, so a spread exists
    assert image["encode_ms"] > 0 and image["encode_std"] is not None and image["images_per_s"] > 0
    assert image["ttft_ms"] >= image["encode_ms"] and image["prompt_tokens"] >= 4
    text = cli(*args, "--image", str(pictures[0]))
    assert "| images | prompt | encode | images/s |" in text.stdout
    assert all("case" not in r for r in json.loads(cli(*args, "--json").stdout))  # no image, no image row
    bad = cli(*args, "--image", str(pictures[0]), "--no-mmproj")
    assert bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--mmproj" in bad.stderr
