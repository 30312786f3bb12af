"""The loaded model's facts for serve's informational routes (llama-server's
``/props``, ``/tokenize``, ``/apply-template``; Ollama's ``/api/tags`` and
``/api/show``): read once from the GGUF header and the vocabulary."""

from __future__ import annotations

from pathlib import Path

from localllm.engine.fim import fim_tokens, prompt_text
from localllm.modelfile.model_info import inspect_model
from localllm.serve import thinking
from localllm.serve.llama_routes import ModelFacts


def model_facts(model, path: Path, n_parallel: int, template: str | None = None, *, n_batch: int = 2048, spm_infill: bool = False,
                context: str = "", extra: dict | None = None) -> ModelFacts:
    """``model``: a loaded ``engine.batch.BatchModel``; ``template``: serve's --chat-template(-file);
    ``n_batch`` and ``spm_infill``: serve's --batch and --spm-infill, for /infill; ``context``: a
    request's context and why (``fitting.context_why``), for ``/api/ps``; ``extra``: serve's own
    template variables (--reasoning, --chat-template-kwargs), which /apply-template renders with."""
    tok = model.tok
    header = tok.header
    info = inspect_model(path)

    def special(key: str) -> str:
        tid = header.get(key) if header is not None else None
        return tok.token_bytes(tid, special=True).decode("utf-8", "replace") if isinstance(tid, int) and 0 <= tid < tok.n_vocab else ""

    if template is not None:
        p = Path(template).expanduser()
        source = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else template  # a file's text, or a built-in's name
    else:
        own = header.get("tokenizer.chat_template") if header is not None else None
        source = own if isinstance(own, str) else ""
    return ModelFacts(
        path=str(path),
        n_parallel=n_parallel,
        chat_template=source,
        bos_token=special("tokenizer.ggml.bos_token_id"),
        eos_token=special("tokenizer.ggml.eos_token_id"),
        architecture=info.architecture,
        file_type=info.file_type,
        n_params=info.n_params,
        size_bytes=info.size_bytes,
        n_ctx_train=info.context_length,
        n_embd=info.n_embd,
        tokenize=lambda text, add_special, parse_special: tok.tokenize(text, add_special=add_special, parse_special=parse_special),
        piece=lambda t: tok.token_bytes(t, special=True),
        render=lambda messages, tools=None, kwargs=None, continue_final=False, add_generation_prompt=True: tok.render_chat(
            messages, tools=tools, extra=thinking.merged(extra or {}, kwargs), continue_final=continue_final,
            add_generation_prompt=add_generation_prompt),
        prompt_text=lambda tokens: prompt_text(tok, tokens),
        fim=fim_tokens(tok),
        n_batch=n_batch,
        spm_infill=spm_infill,
        context=context,
    )
