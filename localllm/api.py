"""localllm as a library: load a model, chat or complete with streaming and
stats, ask whether a model fits, quantize it.

The command line and the cockpit are clients of the same load path
(``localllm.runtime``): the fitting service, refereed by llama.cpp's dry run,
then the load, checked against it. Everything here is typed against the
``Engine`` protocol, so a test can hand ``load`` the scripted fake
(``localllm.testing.ScriptedEngine``) instead of llama.cpp::

    import localllm

    with localllm.load("smollm2", ctx=2048) as model:
        reply = model.chat("Name three rivers.", max_tokens=64, temperature=0)
        for piece in reply:  # text as it streams
            print(piece, end="", flush=True)
        print(f"\\nTTFT {reply.stats.ttft_ms:.0f} ms, {reply.stats.decode_tokens_per_s:.0f} t/s")
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from localllm import runtime
from localllm.chat.session import ChatSession
from localllm.engine_api import Engine, Generation, GenerationStats, LoadConfig, LoadInfo, SamplingConfig
from localllm.errors import InputError, UsageError
from localllm.plan import fitting
from localllm.plan import prepare as prepare_mod
from localllm.plan.hardware import Hardware
from localllm.plan.memcheck import MemoryCheck
from localllm.quantize import naming, pipeline

ModelRef = str | Path | None  # a name (catalog, built-in, pulled), a path, or None for the default model


def resolve(model: ModelRef = None) -> Path:
    """The GGUF file a model name or path stands for (``localllm list`` shows the names)."""
    return runtime.resolve(model)


def prepare(path: Path, request: fitting.Request, *, vram: int | str | None = None, n_ctx: int | None = None, n_seq: int = 1,
            rpc: Sequence[object] = (), hw: Hardware | None = None, dry_run: bool = True, cross_check: bool = False,
            serving: bool = False) -> prepare_mod.LoadPlan:
    """The fitting service asked about a model file with a full ``Request``
    (which settings the user fixed, the policy), refereed: llama.cpp's dry run
    where the graph replay does not cover the model (``plan.prepare.prepare_load``),
    a config llama.cpp refuses raised as ``EngineError``. ``vram`` overrides the
    detected GPU budget (``hw``: hardware already detected); ``rpc`` lists llama.cpp
    RPC workers whose devices join this machine's (each is probed first). What
    ``plan``, the router's memory plan and the cockpit's screens ask; a load asks
    ``localllm.runtime``, which asks the same. ``serving`` with no ``n_ctx``: a
    server's default context, the trained one for each of ``n_seq`` sequences
    (``fitting.for_header``)."""
    return runtime.prepare(path, request, vram=vram, n_ctx=n_ctx, n_seq=n_seq, rpc=rpc, hw=hw, dry_run=dry_run, cross_check=cross_check,
                           serving=serving)


def _request(model: ModelRef, ctx: int | None, vram: int | str | None, kv_type: str | None, n_gpu_layers: int | None,
             threads: int | None, flash_attn: str, policy: str) -> runtime.LoadRequest:
    options = fitting.LoadOptions(n_ctx=ctx, threads=threads, n_gpu_layers=n_gpu_layers, type_k=kv_type, type_v=kv_type,
                                  flash_attn=flash_attn, policy=policy)
    return runtime.LoadRequest(model=model, options=options, vram=vram)


def fit(model: ModelRef = None, *, ctx: int | None = None, vram: int | str | None = None, kv_type: str | None = None,
        n_gpu_layers: int | None = None, threads: int | None = None, flash_attn: str = "auto",
        policy: str = "ctx") -> fitting.Fit:
    """Does ``model`` fit this machine (or ``vram``), and with which settings?
    The settings you name are kept; the others shrink until it fits. ``ctx``
    None: the model's trained context, at most 4096. Reads the file's header
    (and llama.cpp's dry run of it, where the graph replay does not cover the
    model): nothing is loaded."""
    return runtime.plan(_request(model, ctx, vram, kv_type, n_gpu_layers, threads, flash_attn, policy)).fit


def load(model: ModelRef = None, *, ctx: int | None = None, vram: int | str | None = None, kv_type: str | None = None,
         n_gpu_layers: int | None = None, threads: int | None = None, flash_attn: str = "auto", policy: str = "ctx",
         engine: Engine | None = None) -> Model:
    """Fit ``model`` to this machine (as ``fit``) and load it: a ``Model`` to chat
    with or complete from; ``DoesNotFit`` (an ``InputError``) when it does not
    fit. ``engine`` defaults to llama.cpp; a test may pass
    ``localllm.testing.ScriptedEngine()``. Close the model (or use ``with``)."""
    loaded = runtime.open_model(_request(model, ctx, vram, kv_type, n_gpu_layers, threads, flash_attn, policy), engine)
    return Model(loaded.path, loaded.engine, loaded.planned.fit, loaded.info, loaded.memory_check)


_DEF = SamplingConfig()  # the one set of sampling defaults (llama.cpp's), as the CLI, the cockpit and serve use


def _sampling(temperature: float, top_k: int, top_p: float, min_p: float, seed: int | None, max_tokens: int,
              repeat_penalty: float) -> SamplingConfig:
    s = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, max_tokens=max_tokens,
                       repeat_penalty=repeat_penalty)
    problem = s.problem()
    if problem is not None:
        raise UsageError(problem)
    return s


class Response:
    """A reply as it streams: iterate it for text pieces; ``text()`` waits for
    the whole reply; ``stats`` (TTFT, ITL, rates) exist once it has ended.
    ``close()`` stops it early (its stats are still computed)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        self._pieces: list[str] = []

    def __iter__(self) -> Iterator[str]:
        for event in self.generation:
            self._pieces.append(event.text)
            yield event.text

    def text(self) -> str:
        for _ in self:
            pass
        return "".join(self._pieces)

    @property
    def stats(self) -> GenerationStats | None:
        return self.generation.stats

    def close(self) -> None:
        self.generation.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Conversation:
    """A multi-turn chat: each ``send`` feeds the engine only the new turn, and
    a full context slides (the system prompt stays) instead of stopping."""

    def __init__(self, engine: Engine, system: str | None, sampling: SamplingConfig) -> None:
        self.session = ChatSession(engine, system_prompt=system, sampling=sampling, on_notice=lambda _msg: None)

    def send(self, text: str) -> Response:
        return Response(self.session.send(text))

    @property
    def messages(self) -> list[dict[str, str]]:
        return list(self.session.messages)


class Model:
    """A loaded model: ``complete`` continues text, ``chat`` answers one message
    with the model's chat template, ``conversation`` keeps the history."""

    def __init__(self, path: Path, engine: Engine, fitted: fitting.Fit, info: LoadInfo, memory_check: MemoryCheck | None) -> None:
        self.path, self.engine, self.fit, self.info, self.memory_check = path, engine, fitted, info, memory_check

    @property
    def config(self) -> LoadConfig:
        """What was loaded (the fitted settings)."""
        return self.fit.config

    def complete(self, prompt: str, *, max_tokens: int = _DEF.max_tokens, temperature: float = _DEF.temperature, top_k: int = _DEF.top_k,
                 top_p: float = _DEF.top_p, min_p: float = _DEF.min_p, seed: int | None = _DEF.seed,
                 repeat_penalty: float = _DEF.repeat_penalty) -> Response:
        """Continue ``prompt`` as plain text (no chat template)."""
        sampling = _sampling(temperature, top_k, top_p, min_p, seed, max_tokens, repeat_penalty)
        return Response(self.engine.stream(prompt, sampling, chat=False))

    def chat(self, message: str, *, system: str | None = None, max_tokens: int = _DEF.max_tokens, temperature: float = _DEF.temperature,
             top_k: int = _DEF.top_k, top_p: float = _DEF.top_p, min_p: float = _DEF.min_p, seed: int | None = _DEF.seed,
             repeat_penalty: float = _DEF.repeat_penalty) -> Response:
        """Answer one message (a fresh conversation each call)."""
        return self.conversation(system=system, max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                 min_p=min_p, seed=seed, repeat_penalty=repeat_penalty).send(message)

    def conversation(self, *, system: str | None = None, max_tokens: int = _DEF.max_tokens, temperature: float = _DEF.temperature,
                     top_k: int = _DEF.top_k, top_p: float = _DEF.top_p, min_p: float = _DEF.min_p, seed: int | None = _DEF.seed,
                     repeat_penalty: float = _DEF.repeat_penalty) -> Conversation:
        return Conversation(self.engine, system, _sampling(temperature, top_k, top_p, min_p, seed, max_tokens, repeat_penalty))

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def quantize_model(model: ModelRef, qtype: str = "Q4_K_M", *, output: str | Path | None = None, allow_requantize: bool = False,
             force: bool = False, threads: int = 0, imatrix: str | Path | None = None,
             on_progress: Callable[[pipeline.Progress], None] | None = None) -> pipeline.Report:
    """Write ``model`` quantized to ``qtype`` (Q8_0, Q4_K_M, ...) next to it, or to
    ``output``; the report says the sizes and bits per weight. The output is
    written whole or not at all."""
    src = resolve(model)
    dst = Path(output) if output is not None else naming.default_output(src, qtype)
    job = pipeline.Job(src, dst, qtype, threads=threads, allow_requantize=allow_requantize, force=force,
                       imatrix=Path(imatrix) if imatrix is not None else None)
    report: pipeline.Report | None = None
    for event in pipeline.run(job):
        if isinstance(event, pipeline.Report):
            report = event
        elif on_progress is not None:
            on_progress(event)
    if report is None:
        raise InputError(f"quantizing {src.name} ended without a report")
    return report
