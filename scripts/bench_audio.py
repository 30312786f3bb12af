"""Audio in here against llama.cpp's ``llama-mtmd-cli --audio``: same model, projector, clip and threads, side by side.

No audio model ships on PyPI, so the projector is the synthetic whisper-style
encoder of scripts/make_audio_projector.py (Ultravox type), by default at
whisper-tiny's size (384 wide, 4 blocks), sized to SmolLM2-135M's n_embd; the
clip is espeak-ng's speech padded with silence to 10 s. Both sides run the same
libmtmd (the vendored llama.cpp); what differs is the path to it: localllm
bounds the file itself (audio.read) and drives the chunks (engine/mtmd.py),
llama-mtmd-cli goes through ``mtmd_helper_eval_chunks``. Each pair is one fresh
load of each, alternating:

- encode time per second of audio: ours from the generation's stats, theirs
  from its log ("mtmd batch encoding done in N ms");
- TTFT: ours from the call to the first token (the file's decode, the mel
  spectrogram, the encode and the prefill); theirs between its log's line just
  before it reads the prompt and the first performance line, printed once its
  one token (-n 1) is out, both stamped by its logger (-lv 4);
- the ratios theirs / ours, as paired_runs' verdict (target >= 0.95);
- a chat's second turn after the clip, its TTFT over the first turn's (the
  audio stays in the KV cache, nothing is encoded again: target <= 0.2).

    python -m scripts.bench_audio [--width 384] [--blocks 4] [--threads 2] [--runs 3] [--seconds 10]
    python scripts/bench_audio.py --quick    # CI: one pair on a small encoder

Needs espeak-ng (apt-get install espeak-ng) and llama-mtmd-cli (scripts/build_llama_tools.sh).
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file (CI's quick mode) as well as with -m

from scripts import llama_tools  # noqa: E402
from scripts.make_audio_projector import AudioSpec, write_audio_projector  # noqa: E402
from scripts.media_runs import Setup, one_reply, two_turns  # noqa: E402
from scripts.paired_runs import verdict_line  # noqa: E402

PROMPT = "What did you hear?"
N_CTX = 1024
TEMPLATE = "chatml"  # both sides: SmolLM2's own template adds a default system prompt, which llama-mtmd-cli's rendering leaves out
SPEECH = ("The quick brown fox jumps over the lazy dog. A bench measures the encoder that hears this sentence, "
          "and the time to the first word of the reply.")
_STAMP = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")


def clip(out: Path, seconds: float) -> Path:
    """espeak-ng's speech as a WAV of exactly ``seconds`` (cut, or padded with silence)."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        raise SystemExit("bench_audio needs espeak-ng: apt-get install espeak-ng (scripts/install.sh --test installs it)")
    import numpy as np

    from localllm.audio import wav
    from localllm.audio.sound import MAX_SECONDS

    raw = out.with_suffix(".espeak.wav")
    subprocess.run([espeak, "-w", str(raw), SPEECH], check=True, capture_output=True, timeout=60)
    data = raw.read_bytes()
    h = wav.parse(data, raw.name, MAX_SECONDS)
    x = wav.samples(data, h)
    n = int(seconds * h.sample_rate)
    x = np.concatenate([x, np.zeros(max(0, n - len(x)), np.float32)])[:n]
    out.write_bytes(wav.canonical(x, h.sample_rate))
    return out


def ours(model: Path, proj: Path, audio: Path, threads: int) -> tuple[float, float, int]:
    """One fresh load (as llama-mtmd-cli does per run), one reply of one token: (encode ms, TTFT ms, prompt tokens)."""
    from localllm.audio.read import load_audio

    s = one_reply(Setup(model, proj, threads, N_CTX, TEMPLATE), PROMPT, load_audio(audio))
    return s.encode_ms, s.ttft_ms, s.prompt_tokens


def turns(model: Path, proj: Path, audio: Path, threads: int) -> tuple[float, float]:
    """A chat's first turn with the clip and a second without: both TTFTs (ms)."""
    from localllm.audio.read import load_audio

    return two_turns(Setup(model, proj, threads, N_CTX, TEMPLATE), (PROMPT, "And what else?"), load_audio(audio))


def _seconds(line: str) -> float | None:
    m = _STAMP.match(line)
    if m is None:
        return None
    minutes, s, ms, us = (int(g) for g in m.groups())  # common/log.cpp's stamp: minutes.seconds.milliseconds.microseconds
    return minutes * 60 + s + ms / 1e3 + us / 1e6


def theirs(cli: Path, model: Path, proj: Path, audio: Path, threads: int) -> tuple[float, float, int]:
    """llama-mtmd-cli on the same files: (encode ms, TTFT ms, prompt tokens) from its own log."""
    out = subprocess.run([str(cli), "-m", str(model), "--mmproj", str(proj), "--audio", str(audio), "-p", PROMPT, "-n", "1",
                          "-t", str(threads), "--temp", "0", "-c", str(N_CTX), "-lv", "4", "--perf", "--chat-template", TEMPLATE],
                         capture_output=True, text=True, timeout=600)
    lines = (out.stdout + out.stderr).splitlines()
    enc = next((float(m.group(1)) for x in lines if (m := re.search(r"(?:batch encoding done|slice encoded) in (\d+) ms", x))), None)
    start = next((_seconds(x) for x in lines if "For normal use cases" in x), None)
    end = next((_seconds(x) for x in lines if "llama_perf_context_print" in x), None)
    n = next((int(m.group(1)) for x in lines if (m := re.search(r"prompt eval time = .* / +(\d+) tokens", x))), None)
    if enc is None or start is None or end is None or n is None:
        raise SystemExit(f"llama-mtmd-cli printed no encode time or timestamps (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return enc, (end - start) * 1000, n


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--width", type=int, default=384, help="the encoder's width (default: whisper-tiny's 384)")
    ap.add_argument("--blocks", type=int, default=4, help="the encoder's blocks (default: whisper-tiny's 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="the clip's length (espeak-ng's speech, padded)")
    ap.add_argument("--quick", action="store_true", help="CI: one pair on a 64-wide, one-block encoder")
    a = ap.parse_args()
    if a.quick:
        a.width, a.blocks, a.runs = 64, 1, 1
    cli = llama_tools.require("llama-mtmd-cli")
    from localllm.store.resolver import resolve

    model = resolve("smollm2")
    with tempfile.TemporaryDirectory() as d:
        proj = write_audio_projector(Path(d) / "mmproj-audio.gguf", AudioSpec(n_embd=a.width, n_ff=4 * a.width, n_head=max(1, a.width // 64),
                                                                                n_block=a.blocks))
        audio = clip(Path(d) / "speech.wav", a.seconds)
        mine, other = [], []
        for _ in range(a.runs):
            mine.append(ours(model, proj, audio, a.threads))
            other.append(theirs(cli, model, proj, audio, a.threads))
        first, second = turns(model, proj, audio, a.threads)
    me, mt = statistics.median(r[0] for r in mine), statistics.median(r[1] for r in mine)
    oe, ot = statistics.median(r[0] for r in other), statistics.median(r[1] for r in other)
    size = f"{a.width}-wide {a.blocks}-block encoder, {a.seconds:g} s clip, {a.threads} thread(s), median of {a.runs}"
    print(f"encode per second of audio, {size}: localllm {me / a.seconds:.1f} ms, llama-mtmd-cli {oe / a.seconds:.1f} ms")
    print(f"TTFT, {size}: localllm {mt:.0f} ms, llama-mtmd-cli {ot:.0f} ms (prompt tokens, the clip's included: "
          f"{mine[0][2]} and {other[0][2]})")
    print(verdict_line("encode speed, llama-mtmd-cli / localllm (target >= 0.95)", [o[0] / m[0] for m, o in zip(mine, other)], 0.95))
    print(verdict_line("TTFT speed, llama-mtmd-cli / localllm (target >= 0.95)", [o[1] / m[1] for m, o in zip(mine, other)], 0.95))
    print(f"second turn TTFT / first turn's (audio kept in the cache): {second / first:.3f} ({second:.1f} ms / {first:.1f} ms, target <= 0.2)")


if __name__ == "__main__":
    main()
