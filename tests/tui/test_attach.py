"""Images and files in the cockpit (issue 49): a path pasted or given to Ctrl+F
becomes a chip (name, size, tokens), the forecast line counts the next message
and forecasts its TTFT, the reply splits TTFT into image encode, prefill and the
first token and sets the forecast against the measured TTFT; a long prompt's
read shows its progress; a message that does not fit offers a reload that
would hold it; a bad file is one line; a saved session keeps its images."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from textual import events

from localllm.chat import sessions
from localllm.cockpit.attachments import dropped_paths, restore_images, shown_saved, split_message
from localllm.tui.app import create_app
from localllm.tui.attachments import AttachScreen, ChipClose, ReloadConfirm
from localllm.tui.settings import Settings
from localllm.util import fmt
from localllm.vision.image import load_image
from localllm.vision.marker import with_images
from scripts.make_vision_model import write_vision_model
from tests.helpers.tui import chat_text, panel_text, scripted_app, until, wait_idle

NOTES = "# Notes\n\nThe pears ripen in September; the apples after them.\n"


def _png(path: Path, seed: int, size: tuple[int, int] = (64, 48)) -> Path:
    a = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(a).save(path, "PNG")
    return path


def _png_claiming(w: int, h: int) -> bytes:
    """A few dozen bytes whose header claims ``w`` x ``h`` pixels (a decompression bomb's shape)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def _notes(app) -> list[str]:
    return [text for role, text in chat_text(app) if role == "note"]


# -- pure parts ---------------------------------------------------------------------------
def test_a_paste_of_paths_is_read_as_files_and_anything_else_as_text(tmp_path: Path) -> None:
    """Terminals paste a dropped file as its path: plain, quoted, backslash-escaped or a file:// URL, several at once."""
    a = tmp_path / "my notes.md"
    a.write_text(NOTES)
    b = tmp_path / "b.png"
    b.write_bytes(b"x")
    assert dropped_paths(str(b)) == [b]
    assert dropped_paths(f"'{a}'") == [a]
    assert dropped_paths(str(a).replace(" ", "\\ ") + " ") == [a]
    assert dropped_paths("file://" + str(a).replace(" ", "%20")) == [a]
    assert dropped_paths(f"'{a}' {b}") == [a, b]
    assert dropped_paths(f"{a}\n{b}".replace(" notes", "\\ notes")) == [a, b]
    for text in ("hello world", "my notes.md", str(tmp_path), f"{b} and more", str(tmp_path / "gone.png"), "'unclosed", ""):
        assert dropped_paths(text) is None, text


def test_a_saved_message_splits_into_its_images_files_and_typed_text() -> None:
    from localllm import attach

    f = attach.Attachment(path="/x/a.md", name="a.md", kind="text", size=10, text="has ``` and ```` inside\n\nFile: b.md\n")
    content = with_images(attach.message("what now?", [f, f]), 2)
    assert split_message(content, True) == (2, ["a.md", "a.md"], "what now?")
    assert shown_saved(content, True, ["x.png", "y.png"]) == "what now?\n↳ image x.png\n↳ image y.png\n↳ file a.md\n↳ file a.md"
    assert split_message("File: typed by hand", False) == (0, [], "File: typed by hand")


def test_images_read_again_are_checked_against_their_pixels(tmp_path: Path) -> None:
    pic = _png(tmp_path / "a.png", 1)
    im = load_image(pic)
    ref = {"name": "a.png", "path": str(pic), "sha256": im.sha256, "width": 64, "height": 48, "bytes": im.file_bytes}
    msgs = [{"role": "user", "content": with_images("what is it?", 1)}, {"role": "assistant", "content": "a cat"}]
    same, images, notes = restore_images(msgs, [ref], can_see=True)
    assert same == msgs and [i.sha256 for i in images] == [im.sha256] and notes == []
    _png(pic, 2)  # the file changed since: its picture is not the one the chat saw
    changed, images, notes = restore_images(msgs, [ref], can_see=True)
    assert images == [] and changed[0]["content"] == "[image a.png: not available]\nwhat is it?"
    assert len(notes) == 1 and "has changed since" in notes[0]
    _, images, notes = restore_images(msgs, [ref], can_see=False)
    assert images == [] and "no projector is loaded" in notes[0]


# -- the cockpit on the scripted engine ---------------------------------------------------------
@pytest.mark.slow
async def test_a_file_becomes_a_chip_counted_forecast_and_measured(synth_model: Path, tmp_path: Path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text(NOTES)
    app, backend = scripted_app(synth_model, ttft_ms=300, itl_ms=5, tokens=4)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await pilot.press("ctrl+f")  # the attach key's path prompt
        await until(pilot, lambda: isinstance(app.screen, AttachScreen), "opened the path prompt")
        app.screen.query_one("#attach-path").value = f"'{notes}'"
        await pilot.press("enter")
        chip = await until(pilot, lambda: app._chips.texts and "tokens" in app._chips.texts[0] and app._chips.texts[0],
                           "showed the file's chip with its tokens", detail=lambda: app._chips.texts)
        n_file = app.chips[0].tokens
        assert chip == f"▤ text notes.md · {len(NOTES.encode())} B · {n_file} tokens" and n_file > 10
        app._prompt.value = "When do the pears ripen?"
        line = await until(pilot, lambda: app._forecast.text, "showed the forecast line")
        n = int(re.search(r"≈ ([\d,]+) new tokens", line).group(1).replace(",", ""))
        assert n > n_file and "TTFT n/a (nothing measured yet this session)" in line  # n/a before anything was measured
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert app.chips == [] and app._chips.texts == []
        user = [t for role, t in chat_text(app) if role == "user"][-1]
        assert user == f"When do the pears ripen?\n↳ {chip[2:]}"
        sent = backend.chats[-1][-1]
        assert sent["data"] == "file" and sent["content"].startswith("File: notes.md\n```markdown\n# Notes") and \
            sent["content"].endswith("```\n\nWhen do the pears ripen?")
        assert app._forecast.text == "forecast n/a (nothing measured yet this session), measured 300 ms"
        assert "encode n/a · prefill 300.0 ms · first 0.0 ms" in panel_text(app)  # TTFT's split, n/a encode without images
        # the next message is forecast from the reply just measured, and the line follows the box
        app._prompt.value = "And the apples?"
        line = await until(pilot, lambda: "TTFT ≈" in app._forecast.text and app._forecast.text, "forecast from the measured reply",
                           detail=lambda: app._forecast.text)
        assert re.fullmatch(r"≈ \d+ new tokens · TTFT ≈ \d+ ms at [\d,]+ t/s", line), line
        app._prompt.value = "And the apples? " + "Tell me more. " * 40
        await until(pilot, lambda: app._forecast.text != line, "updated the forecast as the box filled")
        assert int(re.search(r"≈ ([\d,]+) new", app._forecast.text).group(1).replace(",", "")) > int(re.search(r"≈ (\d+) new", line).group(1))
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert re.fullmatch(r"forecast [\d.]+ (ms|s), measured 300 ms", app._forecast.text), app._forecast.text


@pytest.mark.slow
async def test_a_chip_is_removed_by_its_cross_or_backspace(synth_model: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.csv"
    a.write_text("alpha\n")
    b.write_text("x,y\n1,2\n")
    app, backend = scripted_app(synth_model)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        app.post_message(events.Paste(f"{a} {b}"))  # two files dropped at once
        await until(pilot, lambda: len(app.chips) == 2 and all(c.tokens for c in app.chips), "attached both files")
        assert app._prompt.value == ""  # the paths were not typed
        await until(pilot, lambda: app._forecast.text, "counted the files")  # the forecast line under the chips: laid out
        await until(pilot, lambda: len(app.query(ChipClose)) == 2 and all(w.region.area for w in app.query(ChipClose)), "laid out the chips")
        await pilot.pause()
        await pilot.click(app.query(ChipClose).first())
        await until(pilot, lambda: [c.name for c in app.chips] == ["b.csv"], "removed the first chip",
                    detail=lambda: [c.name for c in app.chips])
        await pilot.press("backspace")  # in an empty box: the last chip goes
        await until(pilot, lambda: app.chips == [], "removed the last chip")
        app.post_message(events.Paste("look at this file: report.txt"))  # text, not a path
        await until(pilot, lambda: app._prompt.value == "look at this file: report.txt", "typed the paste")
        assert app.chips == []


@pytest.mark.slow
async def test_bad_files_are_one_line_and_the_chat_goes_on(synth_model: Path, tmp_path: Path) -> None:
    from pypdf import PdfWriter

    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)) * 64)
    w = PdfWriter()
    w.add_blank_page(width=72, height=72)
    w.encrypt(user_password="hunter2", owner_password="owner", algorithm="AES-128")
    with (tmp_path / "locked.pdf").open("wb") as f:
        w.write(f)
    _png(tmp_path / "cat.png", 1)
    app, backend = scripted_app(synth_model, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        cases = [("pipe.txt", "is a FIFO (named pipe), not a file"), ("blob.bin", "binary"),
                 ("locked.pdf", "is encrypted (it needs a password)"),
                 ("cat.png", "is a picture, and this model has no projector: start localllm tui with --mmproj FILE")]
        for name, said in cases:
            before = len(_notes(app))
            app.post_message(events.Paste(str(tmp_path / name)))
            await until(pilot, lambda n=before: len(_notes(app)) > n, f"said why {name} is not attached")
            await pilot.pause(0.2)
            new = _notes(app)[before:]
            assert len(new) == 1 and new[0].startswith("not attached: ") and said in new[0] and "\n" not in new[0], new
        assert app.chips == [] and app._prompt.value == ""
        await pilot.press(*"hi", "enter")  # the chat goes on
        await wait_idle(app, pilot)
        assert chat_text(app)[-1] == ("assistant", " tok0 tok1 tok2")


@pytest.mark.slow
async def test_a_long_prompt_shows_its_progress(synth_model: Path, tmp_path: Path) -> None:
    """The engine reports each n_batch chunk read (here 64 tokens): tokens done of the total, and the time left."""
    app, backend = scripted_app(synth_model, ttft_ms=1500, itl_ms=5, tokens=2)
    app.settings = Settings(n_ctx=1024, n_batch=64, n_ubatch=64, system_prompt="")
    seen: list[str] = []
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        app._prompt.value = " ".join(f"w{i}" for i in range(400))
        await pilot.press("enter")

        def progress() -> bool:
            if app._forecast.text.startswith("prefill "):
                seen.append(app._forecast.text)
            return len(set(seen)) >= 3

        await until(pilot, progress, "showed the prefill's progress three times", detail=lambda: app._forecast.text)
        await wait_idle(app, pilot)
    done = [int(re.match(r"prefill ([\d,]+) / ([\d,]+) tokens", s).group(1).replace(",", "")) for s in seen]
    assert done == sorted(done) and done[-1] > 0
    assert all(re.search(r"/ 40\d tokens", s) for s in seen), seen  # the prompt: 400 words and the template's few
    assert any("left" in s for s in seen), seen


@pytest.mark.slow
async def test_a_file_that_does_not_fit_offers_a_reload_that_holds_it(synth_model: Path, tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text(" ".join(f"word{i}" for i in range(1100)))
    app, backend = scripted_app(synth_model, tokens=2)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        app.post_message(events.Paste(str(big)))
        await until(pilot, lambda: app.chips and app.chips[0].tokens, "counted the file")
        app._prompt.value = "summarize"
        await until(pilot, lambda: "does not fit" in app._forecast.text, "said on the forecast line that it does not fit",
                    detail=lambda: app._forecast.text)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, ReloadConfirm), "offered a reload")
        line = _notes(app)[-1]
        assert line.startswith("the message with big.txt does not fit the context:") and "load with --ctx 1536 --kv-type f16" in line
        await pilot.click("#reload-go")
        await until(pilot, lambda: app.load_config is not None and app.load_config.n_ctx == 1536 and not app.busy, "reloaded with --ctx 1536")
        await wait_idle(app, pilot)
        assert app.settings.n_ctx == 1536 and [c.name for c in app.chips] == ["big.txt"] and app._prompt.value == "summarize"
        await pilot.press("enter")  # it fits now
        await wait_idle(app, pilot)
        assert backend.chats[-1][-1]["content"].endswith("summarize") and chat_text(app)[-1][0] == "assistant"


# -- a vision model (the synthetic one: a real projector through libmtmd) ------------------------
@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_vision_model(tmp_path_factory.mktemp("vision"))


def _vision_app(model: Path, **kw):
    return create_app(str(model), vram=4 * 1024**3, bandwidth=20e9,
                      settings=Settings(n_ctx=512, threads=1, temperature=0, max_tokens=4, system_prompt=""), **kw)


@pytest.mark.slow
async def test_an_image_on_a_vision_model_splits_ttft_and_saves_its_path(vision_model, tmp_path: Path) -> None:
    model, proj = vision_model
    pic = _png(tmp_path / "pic one.png", 1)
    (tmp_path / "bomb.png").write_bytes(_png_claiming(30000, 30000))
    app = _vision_app(model, mmproj=str(proj))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        assert "vision: projector mmproj-model.gguf (gemma3, images at 32 px, 4 tokens an image) · Ctrl+F attaches" in _notes(app)
        before = len(_notes(app))
        app.post_message(events.Paste(str(tmp_path / "bomb.png")))
        await until(pilot, lambda: len(_notes(app)) > before, "refused the decompression bomb")
        assert _notes(app)[before:] == ["not attached: image bomb.png claims more pixels than Pillow allows (a decompression bomb?)"]
        app.post_message(events.Paste(str(pic).replace(" ", "\\ ")))  # dropped: its space escaped
        chip = await until(pilot, lambda: app._chips.texts and app._chips.texts[0], "showed the image's chip")
        assert chip == f"▣ image pic one.png · {fmt.size(pic.stat().st_size)} · 64x48 · 4 image tokens"
        app._prompt.value = "What is it?"
        line = await until(pilot, lambda: app._forecast.text, "forecast the message with its image")
        assert re.match(r"≈ \d+ new tokens · TTFT n/a", line), line
        await pilot.press("enter")
        await wait_idle(app, pilot)
        text = panel_text(app)
        split = re.search(r"encode ([\d.]+) ms \(([\d.]+) images/s\) · prefill ([\d.]+) ms · first ([\d.]+) ms", text)
        assert split and float(split.group(1)) > 0 and float(split.group(2)) > 0, text
        await pilot.pause(0.5)  # past the count's delay: a fast reply's line is not wiped by the box emptied at Enter
        assert re.fullmatch(r"forecast n/a \(nothing measured yet this session\), measured \d+(\.\d)? (ms|s)", app._forecast.text)
        assert app.chat is not None and len(app.chat.images) == 1
        app.wait_for_saves()
        saved = sessions.load(app.saved.id)
        assert saved.images == [{"name": "pic one.png", "path": str(pic.resolve()), "sha256": app.chat.images[0].sha256,
                                 "width": 64, "height": 48, "bytes": pic.stat().st_size}]
        assert saved.messages[0]["content"] == "<__media__>\nWhat is it?"
        # the next message: its forecast counts the image's encode as measured, nothing re-encoded
        app._prompt.value = "And its colours?"
        line = await until(pilot, lambda: "TTFT ≈" in app._forecast.text and app._forecast.text, "forecast the second message")
        encoded = app.backend.projector.encoded
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert app.backend.projector.encoded == encoded  # the image stayed in the KV cache
        assert "encode n/a · prefill" in panel_text(app)
    # reopened in a new cockpit: the KV cache kept as it quit (chat.resume) is loaded, and no image is encoded again
    saved = sessions.load(saved.id)
    assert saved.kv is not None and sessions.state_path(saved.id).stat().st_size > 0
    kept = {p: p.read_bytes() for p in (sessions.state_path(saved.id), sessions.state_path(saved.id).with_suffix(".json"))}
    for damaged in (False, True):  # (that the kept cache gives the logits reading again gives: tests/vision/test_mtmd.py)
        for path, data in kept.items():  # the same conversation each time (the first cockpit's quit wrote over it)
            path.write_bytes(data[:-4096] if damaged and path.suffix == ".state" else data)
        again = _vision_app(model)
        async with again.run_test(size=(140, 40)) as pilot:
            await wait_idle(again, pilot)
            again.open_session(sessions.load(saved.id))
            said = "the kept KV cache is not used" if damaged else "the conversation's KV cache was kept: its 1 image(s) are not encoded again"
            await until(pilot, lambda said=said, again=again: any(said in n for n in _notes(again)), "said whether the kept cache was used",
                        detail=lambda again=again: _notes(again))
            assert ("user", "What is it?\n↳ image pic one.png") in chat_text(again)
            await wait_idle(again, pilot)
            await pilot.press(*"more", "enter")
            await wait_idle(again, pilot)
            # kept: nothing encoded; damaged: read again, the image encoded once
            assert again.backend.projector.encoded == int(damaged) and chat_text(again)[-1][0] == "assistant"
    _png(pic, 7)  # the picture changed on disk: the reopened chat says so and goes on without it
    third = _vision_app(model)
    async with third.run_test(size=(140, 40)) as pilot:
        await wait_idle(third, pilot)
        third.open_session(sessions.load(saved.id))
        await until(pilot, lambda: any("is not in the chat again" in n for n in _notes(third)), "said the image changed",
                    detail=lambda: _notes(third))
        await wait_idle(third, pilot)
        assert third.chat is not None and third.chat.images == []
        await pilot.press(*"more", "enter")
        await wait_idle(third, pilot)
        assert chat_text(third)[-1][0] == "assistant"


@pytest.mark.slow
def test_tui_mmproj_errors_are_one_line_before_the_screen(vision_model, tmp_path: Path) -> None:
    from tests.helpers.cli import cli

    model, proj = vision_model
    r = cli("tui", str(proj), "--mmproj", str(proj))
    assert r.returncode != 0 and "is a projector (mmproj), not a model" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("tui", str(model), "--mmproj", str(proj), "--no-mmproj")
    assert r.returncode != 0 and "--mmproj and --no-mmproj contradict each other" in r.stderr


# -- a real terminal -----------------------------------------------------------------------
@pytest.mark.slow
def test_a_path_pasted_in_a_terminal_becomes_a_chip(_isolated_home: Path, synth_model: Path, tmp_path: Path) -> None:
    """``tmux paste-buffer -p`` pastes as a terminal does a dropped file: its path, bracketed."""
    import subprocess

    from scripts.tmuxdrive import Tmux, require
    from tests.helpers.paths import REPO

    require()
    notes = tmp_path / "dropped notes.md"
    notes.write_text(NOTES)
    out = tmp_path / "chats.json"
    env = {"LOCALLLM_HOME": str(_isolated_home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    with Tmux([sys.executable, "-m", "tests.helpers.scripted_cockpit", str(synth_model), str(out)], env=env, width=120, height=32) as t:
        t.wait_for(r"context 1024", timeout=60)
        buffer = f"paste-{t.name}"
        assert subprocess.run(["tmux", "set-buffer", "-b", buffer, f"'{notes}'"], capture_output=True).returncode == 0
        assert subprocess.run(["tmux", "paste-buffer", "-p", "-d", "-b", buffer, "-t", t.name], capture_output=True).returncode == 0
        t.wait_for(r"▤ text dropped notes\.md · \d+ B · \d+ tokens", timeout=30)
        t.send("what is in it?", literal=True)
        t.wait_for(r"≈ \d+ new tokens · TTFT n/a", timeout=30)
        t.send("Enter")
        t.wait_for(r"↳ text dropped notes\.md", timeout=30)
        t.wait_for(r"forecast n/a .*measured", timeout=30)
        t.send("C-q")
        deadline = time.monotonic() + 30
        while not (out.exists() and out.read_text().endswith("}")):  # written as the cockpit ends
            assert time.monotonic() < deadline, "the cockpit never wrote what it was given"
            time.sleep(0.05)  # polled, the deadline above
    sent = json.loads(out.read_text())["chats"][-1][-1]
    assert sent["content"].startswith("File: dropped notes.md\n```markdown\n# Notes") and sent["content"].endswith("what is in it?")


def test_no_pixels_in_a_saved_session(tmp_path: Path) -> None:
    """A saved session keeps each image's path and the sha256 of its pixels: a few hundred bytes, not the picture."""
    s = sessions.SavedSession.new("m.gguf", None, {})
    s.messages = [{"role": "user", "content": with_images("hi", 1)}]
    s.images = [{"name": "a.png", "path": "/x/a.png", "sha256": "0" * 64, "width": 4000, "height": 3000, "bytes": 5_000_000}]
    data = json.loads(json.dumps(dataclasses.asdict(s)))
    back = sessions.from_dict(data, tmp_path / "x.json")
    assert back.images == s.images and len(json.dumps(data)) < 1024
    assert s.title == "hi" and "[image: a.png]\nhi" in sessions.to_markdown(s)  # the marker named, never shown as <__media__>
    data["images"] = [{"name": "b.png", "path": 3}, "junk"]  # outside data: kept as names, so the markers still pair in order
    assert sessions.from_dict(data, tmp_path / "x.json").images == [{"name": "b.png"}, {"name": "image"}]



# -- an audio model (SmolLM2 with the synthetic audio projector: a real encoder through libmtmd) --------
@pytest.mark.slow
async def test_a_sound_file_on_an_audio_model_is_a_chip_its_own_encode_phase_and_saved(smollm2: Path, tmp_path: Path) -> None:
    from scripts.make_audio_projector import write_audio_projector
    from tests.audio.conftest import tone, wav_bytes

    proj = write_audio_projector(tmp_path / "mmproj-audio.gguf")
    clip, other = tmp_path / "tone one.wav", tmp_path / "two.wav"
    clip.write_bytes(wav_bytes(tone(1.5, 16000), 16000))
    other.write_bytes(wav_bytes(tone(0.5, 16000, 880.0), 16000))
    settings = Settings(n_ctx=1024, threads=2, temperature=0, max_tokens=2, system_prompt="")
    app = create_app(str(smollm2), vram=4 * 1024**3, bandwidth=20e9, settings=settings, mmproj=str(proj))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        assert "audio: projector mmproj-audio.gguf (ultravox, 125 tokens each 30 s of sound) · Ctrl+F attaches a sound file" in _notes(app)
        app.post_message(events.Paste(str(clip).replace(" ", "\\ ")))
        chip = await until(pilot, lambda: app._chips.texts and app._chips.texts[0], "showed the clip's chip")
        assert chip == f"♪ audio tone one.wav · {fmt.size(clip.stat().st_size)} · 0:01.5 · 125 audio tokens"
        app._prompt.value = "What is it?"
        line = await until(pilot, lambda: app._forecast.text, "forecast the message with its clip")
        n = int(re.search(r"≈ ([\d,]+) new tokens", line).group(1))
        assert n > 125 and "TTFT n/a" in line, line
        await pilot.press("enter")
        await wait_idle(app, pilot)
        text = panel_text(app)
        split = re.search(r"encode ([\d.]+) ms \(([\d.]+) s of audio/s\) · prefill ([\d.]+) ms", text)
        assert split and float(split.group(1)) > 0 and float(split.group(2)) > 0, text
        assert ("user", f"What is it?\n↳ audio {chip[8:]}") in chat_text(app)
        app.wait_for_saves()
        saved = sessions.load(app.saved.id)
        assert saved.images == [{"kind": "audio", "name": "tone one.wav", "path": str(clip.resolve()), "sha256": app.chat.images[0].sha256,
                                 "seconds": 1.5, "bytes": clip.stat().st_size}]
        # another clip: its forecast counts the audio encode measured on the first (n/a before any was measured)
        app.post_message(events.Paste(str(other)))
        await until(pilot, lambda: len(app.chips) == 1, "attached the second clip")
        app._prompt.value = "And this one?"
        await until(pilot, lambda: "TTFT ≈" in app._forecast.text, "forecast with the measured audio encode", detail=lambda: app._forecast.text)
    clip.write_bytes(wav_bytes(tone(1.5, 16000, 220.0), 16000))  # changed on disk: the reopened chat says so and goes on without it
    again = create_app(str(smollm2), vram=4 * 1024**3, bandwidth=20e9, settings=settings, mmproj=str(proj))
    async with again.run_test(size=(140, 40)) as pilot:
        await wait_idle(again, pilot)
        again.open_session(sessions.load(saved.id))
        await until(pilot, lambda: any("audio tone one.wav is not in the chat again" in x for x in _notes(again)), "said the clip changed",
                    detail=lambda: _notes(again))
        await wait_idle(again, pilot)
        assert again.chat is not None and again.chat.images == []
