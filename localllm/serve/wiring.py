"""A loaded model's pieces as the server's state: tokenizing with the chat
template and images, embeddings, reranking and the facts the informational
routes read (llama-server's ``/props``, ``/tokenize``, ``/apply-template``;
Ollama's ``/api/tags`` and ``/api/show``).

They were closures in the ``serve`` command; here they take the loaded model
and the options only, so that ``localllm.serve.Server`` builds the same
server for the command line and for a program that loaded its model itself.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localllm import reasoning
from localllm.engine.fim import fim_tokens, prompt_text
from localllm.errors import LocalLLMError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.modelfile.model_info import describe
from localllm.serve import media, thinking
from localllm.serve.llama_routes import ModelFacts
from localllm.serve.protocol import RequestError

HEAD_TENSORS = ("cls.weight", "cls.output.weight")  # llama.cpp's LLM_TENSOR_CLS and LLM_TENSOR_CLS_OUT (src/llama-arch.cpp)
NO_GENERATION = ("this model cannot generate text: llama.cpp computes no logits for it (an encoder such as BERT, with no KV cache); "
                 "it serves /v1/embeddings, and /v1/rerank with --rerank")
NO_POOLING = ("--pooling none gives one vector per token, which an embeddings answer cannot carry (llama-server's /v1/embeddings "
              "refuses it too): restart serve with --pooling mean, cls or last")
NO_HEAD = ("has no classification head (no cls or cls.output tensors): /v1/rerank answers as llama-server does, "
           "but its scores rank nothing (each answer says X-Rerank-Head: none); a reranker GGUF (bge-reranker, jina-reranker, "
           "Qwen3-Reranker) gives real ones")


def has_rank_head(header: GGUFHeader) -> bool:
    """Whether the GGUF has a classification head. Without one, llama-server's rank
    pooling scores a pair by the first component of the first token's hidden state:
    numbers that rank nothing; serve answers as llama-server does, but says so."""
    names = {t.name for t in header.tensors}
    return any(t in names for t in HEAD_TENSORS)


def template_defaults(reasoning_flag: str, kwargs: str | None, model: Any) -> dict:
    """serve's template variables: ``enable_thinking`` (--reasoning) and --chat-template-kwargs
    (serve/thinking.py); ``model`` None: only checks them, before a model is loaded."""
    has_thinking = model is not None and reasoning.markers(model.tok.template.source(model.tok.header))[0] is not None
    try:
        return thinking.defaults(reasoning_flag, has_thinking, kwargs)
    except thinking.KwargsError as exc:
        raise UsageError(str(exc)) from None


def embeddings(model: Any, n_ctx: int, pooling: str | None, run: Callable, *, at_start: bool, metrics: Any = None) -> Any:
    """/v1/embeddings on the served model (its embedding context is made on first use, or now with ``at_start``: --embeddings).
    ``run`` makes the embedder's llama.cpp calls: the scheduler's engine thread (``Scheduler.run``, in serve/scheduler.py's docstring why)."""
    from localllm.serve.embeddings import Embeddings  # lazy: with Starlette (~64 ms), which serve loads only once it starts

    emb = model.embedder(n_ctx, pooling)
    if at_start:
        emb.open(run)

    def embed(inputs: Any) -> list[list[float]]:
        """The vectors, counted in ``metrics`` (serve's ServerMetrics) as llama-server counts an embedding request."""
        before, t0 = getattr(emb, "decodes", 0), time.perf_counter()
        out = emb.embed(inputs, run)
        if metrics is not None:
            metrics.embedded(sum(len(x) for x in inputs), getattr(emb, "decodes", 0) - before, time.perf_counter() - t0)
        return out

    return Embeddings(tokenize=lambda text: model.tok.tokenize(text, add_special=True, parse_special=False),
                      embed=embed,
                      n_ctx=emb.n_ctx, n_vocab=model.tok.n_vocab, n_embd=emb.n_embd, pooling=emb.pooling,
                      tokenize_piece=lambda text: model.tok.tokenize(text, add_special=False, parse_special=False))


def rerank(model: Any, n_ctx: int, scheduler: Any, head: bool = True) -> Any:
    """/v1/rerank on the served model: its rank context (engine/rank.py), opened now so that a failure shows at start.
    Its decodes run on the scheduler's engine thread, as the embeddings' (``Scheduler.call``: the route awaits them)."""
    from localllm.serve.rerank import Rerank  # lazy: with Starlette, as embeddings

    ranker = model.ranker(n_ctx)
    ranker.open(scheduler.run)
    return Rerank(pair=lambda query, doc: ranker.pair(query, doc, model.tok.tokenize), batches=ranker.batches,
                  decode=lambda groups: scheduler.call(functools.partial(ranker.decode_slice, groups)), n_ctx=ranker.n_ctx, head=head)


def check_projector(model: Any, path: Path) -> None:
    """The projector the load path loaded on the model: refused at start when an image
    would not fit one ubatch where libmtmd decodes it whole (Gemma 3's: every request would fail)."""
    from localllm.vision.image import RGBImage  # lazy: as the projector, only for a vision model

    if getattr(model.projector, "vision", True) is False:  # an audio-only projector: an audio chunk is never decoded whole
        return
    mp = model.image_prompt(RGBImage(name="probe", width=8, height=8, rgb=bytes(8 * 8 * 3), file_bytes=0, sha256="probe"))
    try:
        for piece in mp.pieces:
            n_ubatch = model.image_too_large(piece) if piece.is_image else None
            if n_ubatch is not None:
                raise UsageError(f"an image is {piece.n_tokens} tokens through {path.name}, decoded in one ubatch, but --ubatch is {n_ubatch}: "
                                 f"serve it with --ubatch {piece.n_tokens} (and --batch at least that)")
    finally:
        mp.close()


def facts(model: Any, path: Path, header: GGUFHeader, n_parallel: int, template: str | None = None, *, n_batch: int = 2048,
          spm_infill: bool = False, context: str = "", extra: dict | None = None) -> ModelFacts:
    """``model``: a loaded ``engine.batch.BatchModel``; ``header``: its GGUF header as the
    load path read it (no second read); ``template``: serve's --chat-template(-file);
    ``n_batch`` and ``spm_infill``: serve's --batch and --spm-infill, for /infill;
    ``context``: a request's context and why (``fitting.context_why``), for ``/api/ps``;
    ``extra``: serve's own template variables (--reasoning, --chat-template-kwargs),
    which /apply-template renders with."""
    tok = model.tok
    info = describe(header)

    def special(key: str) -> str:
        tid = header.get(key)
        return tok.token_bytes(tid, special=True).decode("utf-8", "replace") if isinstance(tid, int) and 0 <= tid < tok.n_vocab else ""

    if template is not None:
        p = Path(template).expanduser()
        source = p.read_text(encoding="utf-8", errors="replace") if p.is_file() else template  # a file's text, or a built-in's name
    else:
        own = header.get("tokenizer.chat_template")
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
        eog=functools.cache(lambda: tuple(t for t in range(tok.n_vocab) if tok.is_eog(t))),  # 49k calls for SmolLM2: once, when asked
    )


def tokenizer(model: Any, extra: dict, media_path: Path | None = None) -> Callable[[Any], list[int]]:
    """A request's prompt as tokens (in a worker thread): the chat template with
    its tools and template variables, images placed where their parts were
    (``file://`` ones read under ``media_path``: serve's --media-path)."""
    tok = model.tok

    def tokenize(params: Any) -> list[int]:
        if params.images:
            return image_tokens(model, params, runs, media_path)
        if params.chat:
            if tok.has_chat_template:
                # a message's text cannot forge a turn; tools reach the template as Transformers passes them
                return tok.chat_tokens(params.messages, tools=params.tools.template_tools if params.tools else None,
                                       extra=thinking.merged(extra, params.template_kwargs), continue_final=params.continue_final,
                                       add_generation_prompt=params.add_generation_prompt)
            text = "".join(f"{m['role']}: {m['content']}\n" for m in params.messages) + "assistant:"
            return tok.tokenize(text, add_special=True, parse_special=False)
        if isinstance(params.prompt, list):
            return list(params.prompt)
        if not isinstance(params.prompt, str):
            raise RequestError(400, "no prompt")
        return tok.tokenize(params.prompt, add_special=True, parse_special=False)

    def runs(params: Any, marks: list[str]) -> tuple[list[list[int]], list[int]]:
        """The prompt's text, cut where the images' marks stand (as ``tokenize`` reads it)."""
        if tok.has_chat_template:
            return tok.chat_runs(params.messages, marks, tools=params.tools.template_tools if params.tools else None,
                                 extra=thinking.merged(extra, params.template_kwargs), continue_final=params.continue_final,
                                 add_generation_prompt=params.add_generation_prompt)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in params.messages) + "assistant:"
        return tok.text_runs(text, marks)

    return tokenize


def image_tokens(model: Any, params: Any, runs: Callable, media_path: Path | None = None) -> media.MediaTokens:
    """A prompt with images (in a worker thread): each picture decoded and bounded
    (``vision.image``), placed where its part was, and split into libmtmd's chunks;
    each problem a 400 naming the part."""
    from localllm.audio.read import decode_audio  # lazy: as decode_image, only for a request with sound
    from localllm.vision.image import decode_image  # lazy: Pillow, only for a request with images

    first = params.images[0]
    if model.projector is None:
        what, kind = ("audio", "audio") if first.audio else ("an image", "vision")
        raise RequestError(400, f"'{first.where}' is {what}, but this server's model reads text only: start serve with --mmproj FILE "
                           f"(the model's {kind} projector; one beside the model is found without it)", param=first.where)
    for im in params.images:  # a projector without the encoder a part needs: named before anything is decoded
        if getattr(model.projector, "audio" if im.audio else "vision", None) is False:
            what, kind = ("audio", "an audio") if im.audio else ("an image", "a vision")
            raise RequestError(400, f"'{im.where}' is {what}, but this server's projector has no such encoder: start serve with "
                               f"--mmproj FILE ({kind} projector)", param=im.where)
    marks = [im.mark for im in params.images]
    text, order = runs(params, marks)
    lost = [im.where for k, im in enumerate(params.images) if order.count(k) != 1]
    if lost:
        raise RequestError(400, f"the chat template dropped or repeated the image '{lost[0]}': it has no single place in the prompt",
                           param=lost[0])
    pictures = {}
    for k in order:
        im = params.images[k]
        try:
            raw = media.picture_bytes(im, media_path)
            pictures[k] = decode_audio(raw, name=im.where) if im.audio else decode_image(raw, name=im.where)
        except media.ImageError as exc:
            raise RequestError(400, str(exc), param=im.where) from None
        except LocalLLMError as exc:  # damaged, truncated, too many pixels, an SVG, not a picture: one line naming it
            raise RequestError(400, str(exc), param=im.where) from None
    try:
        tokens = media.assemble(text, order, pictures, model.image_prompt)
    except LocalLLMError as exc:  # libmtmd could not preprocess a picture
        raise RequestError(400, str(exc)) from None
    for span in tokens.media.spans:
        n_ubatch = model.image_too_large(span.piece)
        if n_ubatch is not None:
            tokens.media.close()
            where = params.images[span.image].where
            raise RequestError(400, f"'{where}' is {span.n_tokens} tokens, decoded in one ubatch, but this server's --ubatch "
                               f"is {n_ubatch}: restart it with --ubatch {span.n_tokens} (and --batch at least that)", param=where)
    if not tokens or tokens[-1] < 0:
        tokens.media.close()
        raise RequestError(400, "the prompt ends with an image: put text after it")
    return tokens


def compactor(model: Any, scheduler: Any, at: float, n_ctx_seq: int, tokenize: Callable[[Any], list[int]]) -> Any:
    """serve --compact-at's summarizer (serve/compaction.py): the summary request through the
    model's template with thinking off, written on the scheduler as any request."""
    from localllm.serve.compaction import SYSTEM, Compactor, summary_sampling  # lazy: only with --compact-at
    from localllm.serve.scheduler import Job  # lazy: as above

    def summary_prompt(text: str) -> list[int]:
        return model.tok.chat_tokens([{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                                     extra={"enable_thinking": False})

    async def write(prompt: list[int], max_tokens: int) -> str:
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()
        pieces: list[str] = []

        def settle(ok: bool) -> None:
            if not done.done():
                done.set_result(ok)

        def emit(kind: str, payload: object) -> None:  # the engine thread
            if kind == "text":
                pieces.append(str(payload))
            elif kind in ("done", "error"):
                loop.call_soon_threadsafe(settle, kind == "done")

        job = Job(tokens=prompt, sampling=summary_sampling(max_tokens), max_tokens=max_tokens, emit=emit)
        if not scheduler.submit(job):
            return ""
        try:
            ok = await done
        finally:
            if not done.done():  # the client went away while the summary was being written
                scheduler.cancel(job)
        return "".join(pieces) if ok else ""

    return Compactor(at, n_ctx_seq, tokenize, summary_prompt, write)
