"""What a quantization cost, in words: bands of mean KL divergence against the
source, with the figures that back them.

The bands come from llama.cpp's own measurements of LLaMA 3 8B against FP16
(tools/perplexity/README.md of the vendored llama.cpp, "LLaMA 3 8B Scoreboard",
mean KLD): q8_0 0.0014, q6_K 0.0055, q5_K_M 0.0108, q4_K_M 0.0313, q4_0
0.0719, q3_K_M 0.1019, q3_K_S 0.2282, q2_K 0.4451. Each band ends just above a
common type, so a result reads as "like q4_K_M on an 8B model". Small models
lose more at the same type (the README's LLaMA 2 7B q4_K_M: 0.0127, LLaMA 3 8B:
0.0313), so a small model lands in a worse band than its type does on 8B; the
text says so under 1B parameters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SOURCE = "llama.cpp tools/perplexity/README.md (LLaMA 3 8B vs FP16, mean KLD)"
# (upper bound of mean KL divergence, band, the type that ends the band on LLaMA 3 8B)
BANDS = (
    (0.002, "near-lossless", "q8_0 0.0014"),
    (0.012, "small loss", "q6_K 0.0055, q5_K_M 0.0108"),
    (0.040, "moderate loss", "q4_K_M 0.0313"),
    (0.110, "large loss", "q4_0 0.0719, q3_K_M 0.1019"),
    (float("inf"), "severe loss", "q3_K_S 0.2282, q2_K 0.4451"),
)
_LEGACY_4BIT = ("Q4_0", "Q4_1", "IQ4_NL")


@dataclass(frozen=True)
class Verdict:
    qtype: str
    band: str
    text: str  # one line for people
    source: str = SOURCE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(qtype: str, kl_mean: float, top1: float, n_params: int | None = None) -> Verdict:
    """The band of ``kl_mean``, with the top-1 agreement and what to try instead."""
    limit, band, like = next(b for b in BANDS if kl_mean <= b[0])
    text = f"{qtype}: {band} (mean KL {kl_mean:.4f}, top-1 agreement {100 * top1:.0f}%; on LLaMA 3 8B this band holds {like})"
    if band in ("large loss", "severe loss"):
        if qtype.upper() in _LEGACY_4BIT:
            text += "; Q4_K_M is usually the better 4-bit choice (mean KL 0.031 vs Q4_0's 0.072 on LLaMA 3 8B, at about the same size)"
        elif band == "severe loss":
            text += "; try Q4_K_M or a larger type"
        else:
            text += "; Q5_K_M or Q6_K keep much more (0.011 and 0.005 on LLaMA 3 8B)"
    if n_params is not None and n_params < 1_000_000_000:
        text += f"; a {n_params / 1e6:.0f}M-parameter model loses more than an 8B one at the same type"
    return Verdict(qtype, band, text)
