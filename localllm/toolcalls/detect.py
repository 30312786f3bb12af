"""Which format a chat template speaks, read from the markers that define
it, in the order llama.cpp's ``common/chat.cpp`` tries its specialized
parsers (``common_chat_try_specialized_template``) and then the families its
autoparser (``common/chat-diff-analyzer.cpp``) finds by rendering the
template: a family is recognised by the markers it writes around a call,
all of them, never by one substring several families share (``<tool_call>``
is Hermes's, Qwen3-Coder's, GLM's and MiniMax M3's). A template none of
these fits gets the generic format, where llama.cpp's autoparser would fail.
"""

from __future__ import annotations

from dataclasses import replace

from localllm.reasoning import markers
from localllm.toolcalls.base import Format
from localllm.toolcalls.channels import FUNCTIONARY_V3_2, HARMONY
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
from localllm.toolcalls.xmlish import GLM, MINICPM5, MINIMAX, QWEN3_CODER, SEED_OSS


def _all(src: str, *marks: str) -> bool:
    return all(m in src for m in marks)


# (the markers that must all be in the template, the ones that must not, the format), in the order tried
RULES: tuple[tuple[tuple[str, ...], tuple[str, ...], Format], ...] = (
    (("[TOOL_CALLS]", "[ARGS]"), (), MINISTRAL),  # Ministral 3, Magistral, Mistral Small 3.2 ([CALL_ID]), Devstral
    (("<|channel|>", "<|message|>"), (), HARMONY),  # gpt-oss
    ((">>>all", ">>>${recipient}"), (), FUNCTIONARY_V3_2),
    (("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), ("<|open|>",), KIMI_K2),
    (("<|START_ACTION|>", "<|END_ACTION|>"), ("<|START_TEXT|>",), COMMAND_R7B),  # Command R7B (Cohere2 MoE's <|START_TEXT|> is not read)
    (("<|tool_list_start|>",), (), LFM2),  # LFM2 (llama.cpp's is_lfm2_template)
    (("List of tools: [",), (), LFM2),  # LFM2.5: the same calls, a plain tools list
    (("<|tool_call_start|>", "<|tool_call_end|>"), (), LFM2),
    (("<tool_call>", "<function=", "<parameter="), ("]<]minimax[>[", "'<tool_call><function=' ~ tool_call.name ~ '>'"), QWEN3_CODER),
    (("<seed:tool_call>", "<function="), (), SEED_OSS),
    (("<minimax:tool_call>", "<invoke name="), (), MINIMAX),  # MiniMax M2
    (("<tool_call>", "<arg_key>", "<arg_value>"), (), GLM),  # GLM 4.5, 4.6, 4.7, Ling 3
    (("Tool usage guidelines:", '<function name="', '<param name="'), (), MINICPM5),
    (("<|role_sep|>", "<|message_sep|>"), ("<|function_call|>",), GIGACHAT3),
    (("<|role_sep|>", "<|message_sep|>", "<|function_call|>"), (), GIGACHAT31),
    (("<|START_OF_TURN_TOKEN|>", "Action:", "```json"), ("<|START_ACTION|>",), COMMAND_R_PLUS),
    (("]<]minimax[>[", "<tool_call>", "<invoke name="), (), MINIMAX_M3),
    (("dsml_token", "DSML"), (), DEEPSEEK_DSML),  # DeepSeek V3.2, V4
    (("'<|tool_call>call:'",), (), GEMMA4),
    (("<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"), ("dsml_token",), DEEPSEEK),  # DeepSeek R1, V3.1
    (("<tool_calls>", "</tool_calls>"), (), APRIEL),  # Apriel 1.5, 1.6
    (("<|tools_prefix|>", "<|tools_suffix|>"), (), APERTUS),
    (("<TOOLCALL>", "</TOOLCALL>"), (), NEMOTRON_V2),  # Nemotron Nano v2
    (("<|tool_call|>",), ("<tool_call>",), GRANITE),  # Granite 3.x
    ((" functools[",), (), FIREFUNCTION),
    (("<function=", "<|start_header_id|>"), (), FUNCTIONARY_V3_1),  # Functionary v3.1 (Llama 3.1 based)
    # Qwen 2.5/3, QwQ, Hermes 2/3, Granite 4
    (("<tool_call>", "</tool_call>"), ("]<]minimax[>[", "<invoke name=", "<|role_sep|>", "<role>ASSISTANT</role>"), HERMES),
    (("[TOOL_CALLS]",), (), MISTRAL),  # Mistral v0.3, Nemo
    (("<|start_header_id|>", "ipython", "tools"), (), LLAMA3),  # Llama 3.1, 3.2, 3.3
)


def detect(template: str | None) -> Format:
    """The call format a chat template's text teaches (``generic`` when none)."""
    if not template:
        return GENERIC
    for need, refuse, fmt in RULES:
        if _all(template, *need) and not any(r in template for r in refuse):
            return fmt
    if "System role not supported" in template:
        return replace(GENERIC, system_role=False)
    return GENERIC


def preserved(template: str | None) -> tuple[str, ...]:
    """The texts a reply must show even where the model's vocabulary holds them
    as control tokens: the tool-call format's (``Format.preserved``) and the
    thinking markers the template writes (llama.cpp preserves ``<think>``,
    ``[THINK]``... with them). Those that are one token of the vocabulary are
    rendered as text when generated (engine/tokenizer.Tokenizer.shown)."""
    marks, _ = markers(template)
    return tuple(dict.fromkeys(detect(template).preserved + ((marks.open, marks.close) if marks is not None else ())))
