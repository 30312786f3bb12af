"""Tool-call formats as llama.cpp reads them (issue 48, item 1): which one a
chat template speaks (``detect``), and a reply cut into its reasoning (the
``localllm.reasoning`` split), its content and its calls, streamed in chunks
of any size (``Stream``) or whole (``parse``).

One module per group of families (``jsonish``: JSON behind a marker;
``named``: a name in markup and JSON arguments; ``xmlish``: XML-ish
parameters; ``pythonic``: LFM2; ``channels``: gpt-oss's harmony and
Functionary v3.2; ``more``: DeepSeek V3.2/V4's DSML, Gemma 4, MiniMax M3), all read from the vendored llama.cpp's
``common/chat.cpp`` and ``tests/test-chat.cpp``. Pure Python: the grammar a
forced call needs is serve's (``serve/tools.py``), from each format's hints.
"""

from localllm.toolcalls.base import Call, Format
from localllm.toolcalls.channels import FUNCTIONARY_V3_2, HARMONY
from localllm.toolcalls.detect import detect, preserved
from localllm.toolcalls.jsonish import (
    APERTUS,
    APRIEL,
    COMMAND_R7B,
    COMMAND_R_PLUS,
    FIREFUNCTION,
    GENERIC,
    GIGACHAT3,
    GIGACHAT31,
    GRANITE,
    HERMES,
    LLAMA3,
    MISTRAL,
    NEMOTRON_V2,
)
from localllm.toolcalls.more import DEEPSEEK_DSML, GEMMA4, MINIMAX_M3
from localllm.toolcalls.named import DEEPSEEK, FUNCTIONARY_V3_1, KIMI_K2, MINISTRAL
from localllm.toolcalls.pythonic import LFM2
from localllm.toolcalls.stream import Parsed, Stream, collect, parse
from localllm.toolcalls.xmlish import GLM, MINICPM5, MINIMAX, QWEN3_CODER, SEED_OSS

FORMATS = (HERMES, LLAMA3, MISTRAL, GENERIC, NEMOTRON_V2, GRANITE, COMMAND_R7B, COMMAND_R_PLUS, APERTUS, APRIEL, FIREFUNCTION,
           GIGACHAT3, GIGACHAT31, FUNCTIONARY_V3_1, MINISTRAL, KIMI_K2, DEEPSEEK, HARMONY, FUNCTIONARY_V3_2, QWEN3_CODER, SEED_OSS,
           MINIMAX, MINIMAX_M3, MINICPM5, GLM, LFM2, DEEPSEEK_DSML, GEMMA4)

__all__ = ["APERTUS", "APRIEL", "COMMAND_R7B", "COMMAND_R_PLUS", "DEEPSEEK", "DEEPSEEK_DSML", "FIREFUNCTION", "FORMATS",
           "FUNCTIONARY_V3_1", "FUNCTIONARY_V3_2", "GEMMA4", "GENERIC", "GIGACHAT3", "GIGACHAT31", "GLM", "GRANITE", "HARMONY",
           "HERMES", "KIMI_K2", "LFM2", "LLAMA3", "MINICPM5", "MINIMAX", "MINIMAX_M3", "MINISTRAL", "MISTRAL", "NEMOTRON_V2",
           "QWEN3_CODER", "SEED_OSS", "Call", "Format", "Parsed", "Stream", "collect", "detect", "parse", "preserved"]
