"""A server from the library: ``Server(model, ServeOptions(...))``.

``localllm serve MODEL`` turns its flags into ``ServeOptions`` and runs
``Server(planned, options).run()``; a program that loaded a model itself
(``runtime.open_model(LoadRequest(..., serving=True))``) serves it the same
way, in its own thread::

    from localllm import runtime
    from localllm.serve import Server, ServeOptions

    request = runtime.LoadRequest(model="smollm2", serving=True, parallel=2)
    with runtime.open_model(request) as loaded, Server(loaded, ServeOptions(port=0)).start() as server:
        print(server.url)  # http://127.0.0.1:PORT/v1, OpenAI, Anthropic, Ollama and llama-server routes

Given a ``runtime.Planned`` (fitted, not loaded) the sockets listen first and
the model loads in a thread meanwhile, requests getting llama-server's 503
"Loading model" (serve/lifecycle.py); given a ``runtime.Loaded`` it serves at
once and leaves the model to its owner. Everything here is Starlette and
uvicorn's, imported when a server starts, not at import.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm import reasoning, runtime
from localllm.engine_api.records import SamplingConfig
from localllm.errors import InputError, UsageError
from localllm.plan import fitting
from localllm.serve import tools, wiring
from localllm.serve.media import MEDIA_BODY
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.prompt_cache import PromptCache
from localllm.serve.scheduler import Scheduler
from localllm.util.fmt import safe

MAX_PARALLEL = 256  # LLAMA_MAX_SEQ (src/llama-cparams.h)


def _say(line: str) -> None:
    print(f"localllm: {safe(line)}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ServeOptions:
    """How to serve a model: what ``localllm serve MODEL`` takes besides the load
    (the load's own options, ``--ctx``, ``--parallel``, ``--lora``, ``--mmproj``, are
    the ``runtime.LoadRequest``'s). Defaults are the command's."""

    hosts: tuple[str, ...] = ("127.0.0.1",)  # one listening socket each (--host)
    port: int = 8080  # 0: any free one (``Running.url`` says which)
    api_key: str | None = None  # required as 'Authorization: Bearer KEY' on every route
    name: str | None = None  # the model's name in the API (default: the first of ``aliases``, else the file's stem)
    aliases: tuple[str, ...] = ()  # every name of the model, as llama-server's --alias a,b (its /v1/models "aliases")
    tags: tuple[str, ...] = ()  # free labels, as llama-server's --tags (its /v1/models "tags")
    max_queue: int = 64  # requests waiting for a slot before 429
    prefill_chunk: int = 128  # prompt tokens per step while others generate
    cache_ram_mib: int = 8192  # idle prompts kept in RAM (-1: no byte limit, 0: off)
    embeddings_at_start: bool = False  # make /v1/embeddings' context at start (--embeddings)
    pooling: str | None = None  # mean, last, cls, rank (None: the model's)
    rerank: bool = False  # /v1/rerank with the model's classification head
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # a request's omitted fields
    reasoning: str = "auto"  # --reasoning: on, off, auto (the template's thinking switch)
    reasoning_format: str = "auto"  # --reasoning-format: auto (deepseek), deepseek, deepseek-legacy, none
    chat_template_kwargs: str | None = None  # --chat-template-kwargs, JSON text
    spm_infill: bool = False  # /infill's suffix-prefix-middle order
    metrics: bool = True  # /metrics (llama-server answers 501 without --metrics)
    slots: bool = False  # /slots
    slot_save_path: Path | None = None  # /slots/{id}?action=save|restore|erase writes and reads here
    compact_at: float | None = None  # --compact-at: a chat prompt this full of a slot's context has its older turns summarized
    media_path: Path | None = None  # file:// pictures are read under this folder only (llama-server's --media-path); None: refused
    cors: tuple[str, ...] = ()  # origins allowed (--cors-origins); none: no CORS headers at all
    json_log: bool = False  # the request log as one JSON object per line (stderr)
    verbose: bool = False  # every reply carries llama-server's "__verbose" (its --verbose) unless its request says "verbose": false
    header_timeout: float | None = None  # seconds to send a request's head before a 408 (--timeout)
    mcp: Any = None  # a started ``localllm.mcp.Hub`` for /tools, closed by its owner
    sleep_idle_s: float | None = None  # free the model after this long without a request, load it for the next (a Planned only)
    ui_mcp_proxy: bool = False  # /cors-proxy forwards a web page's requests to any URL (llama-server's --ui-mcp-proxy); off: 403
    server_tools: Any = None  # llama-server's built-in tools for /tools (a ``localllm.server_tools.Toolbox``), stopped by its owner

    def check(self, n_seq: int, n_batch: int) -> None:
        """The options that cannot work, before anything listens: one line each."""
        check_serving(self.api_key, n_seq, n_batch, self.reasoning, self.chat_template_kwargs)


def refuse_empty_key(api_key: str | None) -> None:
    """An empty key would silently mean "no authentication": refused rather than guessed."""
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty: give a key (e.g. \"$(openssl rand -hex 16)\"), or leave --api-key out to serve without one")


def check_serving(api_key: str | None, n_seq: int, n_batch: int, reasoning_flag: str = "auto", template_kwargs: str | None = None) -> None:
    """What no server can be started with (``serve`` asks it first, for a model or a router): one line each."""
    refuse_empty_key(api_key)
    if n_seq > MAX_PARALLEL:
        raise UsageError(f"--parallel can be at most {MAX_PARALLEL} (llama.cpp's LLAMA_MAX_SEQ)")
    if n_batch < n_seq:
        raise UsageError(f"--batch {n_batch} cannot hold one token of each of --parallel {n_seq} sequences: raise --batch")
    wiring.template_defaults(reasoning_flag, template_kwargs, None)  # a bad --chat-template-kwargs, before any load


@dataclass
class Built:
    """The server's state over one loaded model: the app and what runs under it."""

    app: Any  # the routes behind the API key; CORS goes around whatever serves them (``Server``: the app, or the sleeper in front of it)
    scheduler: Scheduler
    cache: PromptCache | None
    n_ctx_seq: int
    info: Any


def build(loaded: runtime.Loaded, options: ServeOptions, name: str, *, rerank_head: bool = True, metrics: ServerMetrics | None = None) -> Built:
    """The ASGI app over ``loaded`` (serve's batch engine): its scheduler started,
    embeddings, reranking, the facts, the template's tool and thinking formats."""
    from localllm.serve.app import ServeState, build_app  # lazy: Starlette's routing (~64 ms), once a server starts
    from localllm.serve.handoff import ENGINE  # lazy: asyncio, which the app above loads anyway

    model, info = loaded.engine, loaded.info
    parallel = max(loaded.planned.request.parallel, 1)
    n_ctx_seq = loaded.config.n_ctx // parallel  # as planned: llama.cpp pads its cells (info.n_ctx) to 256
    metrics = metrics if metrics is not None else ServerMetrics()  # a server that slept keeps counting where it was
    metrics.kv_cells_total = info.n_ctx
    # with adapters, a stored state would need its adapter scales along: none kept in RAM (prefix reuse in the KV cache stays)
    cache = (PromptCache(max_bytes=None if options.cache_ram_mib < 0 else options.cache_ram_mib * 2**20, max_tokens=info.n_ctx)
             if options.cache_ram_mib and info.prefix_reuse and not loaded.adapters else None)
    scheduler = Scheduler(model, n_seq=parallel, n_ctx_seq=n_ctx_seq, n_batch=info.n_batch, prefix_reuse=info.prefix_reuse,
                          max_queue=options.max_queue, prefill_chunk=options.prefill_chunk, metrics=metrics, prompt_cache=cache,
                          handoff=ENGINE, adapters=loaded.adapters, n_swa=info.n_swa, speculate=options.sampling.speculate,
                          k_max=info.rows_per_seq - 1)
    scheduler.start()  # before the embeddings: --embeddings opens their context on the engine thread
    try:
        rank = options.rerank or options.pooling == "rank"
        extra = wiring.template_defaults(options.reasoning, options.chat_template_kwargs, model)
        template = model.tok.template.source(model.tok.header)
        context = fitting.context_choice(loaded.planned.fit, parallel)
        state = ServeState(
            scheduler=scheduler, metrics=metrics, model_name=name, n_ctx_seq=n_ctx_seq, n_vocab=info.n_vocab,
            check_grammar=model.check_grammar,
            embeddings=None if options.pooling == "none" else wiring.embeddings(
                model, n_ctx_seq, None if rank else options.pooling, scheduler.run, at_start=options.embeddings_at_start, metrics=metrics),
            no_embeddings=wiring.NO_POOLING if options.pooling == "none" else None,
            rerank=wiring.rerank(model, n_ctx_seq, scheduler, rerank_head) if rank else None,
            no_generation=None if model.can_generate else wiring.NO_GENERATION,
            tool_format=tools.detect(template), reasoning=reasoning.markers(template)[0],
            reasoning_format="deepseek" if options.reasoning_format == "auto" else options.reasoning_format,
            # the prompt's last text tokens (an image's filler ids are no tokens)
            prompt_tail=lambda tokens: b"".join(model.tok.token_bytes(t, special=True) for t in [t for t in tokens[-40:] if t >= 0][-8:])
            .decode("utf-8", "replace"),
            vision=loaded.projector is not None and loaded.projector.has_vision, audio=loaded.projector is not None and loaded.projector.has_audio,
            **({"max_body": MEDIA_BODY} if loaded.projector is not None else {}),
            tokenize=wiring.tokenizer(model, extra, options.media_path), api_key=options.api_key, json_log=options.json_log, defaults=options.sampling,
            facts=wiring.facts(model, loaded.path, loaded.planned.header, parallel, loaded.planned.request.template,
                               n_batch=loaded.config.n_batch, spm_infill=options.spm_infill, context=str(context), extra=extra),
            metrics_endpoint=options.metrics, slots_endpoint=options.slots, mcp=options.mcp, server_tools=options.server_tools,
            slot_save_path=options.slot_save_path,
            compactor=wiring.compactor(model, scheduler, options.compact_at, n_ctx_seq, wiring.tokenizer(model, extra, options.media_path))
            if options.compact_at else None,
            aliases=options.aliases, tags=options.tags, verbose=options.verbose, cors_proxy=options.ui_mcp_proxy)
    except BaseException:
        scheduler.stop()
        raise
    return Built(build_app(state), scheduler, cache, n_ctx_seq, info)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (inheritable: a serve that replaces this one takes it)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise UsageError(f"--host {host}: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}: pick another --port") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def bind_all(hosts: tuple[str, ...] | list[str], port: int) -> list[socket.socket]:
    """One listening socket per host; with port 0 the others take the port the first got."""
    socks = [bind(hosts[0], port)]
    port = socks[0].getsockname()[1]
    try:
        socks += [bind(h, port) for h in hosts[1:]]
    except Exception:
        for sock in socks:
            sock.close()
        raise
    return socks


def shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Server:
    """One model served over HTTP: ``run()`` until a signal (the command line),
    or ``start()`` in a thread of the caller's (the library, tests)."""

    def __init__(self, model: runtime.Loaded | runtime.Planned, options: ServeOptions | None = None, *,
                 say: Callable[[str], None] = _say, socks: list[socket.socket] | None = None, rerank_head: bool = True) -> None:
        self.options = options if options is not None else ServeOptions()
        self.model = model
        planned = model.planned if isinstance(model, runtime.Loaded) else model
        self.options.check(max(planned.request.parallel, 1), planned.config.n_batch)
        self.say = say
        self.rerank_head = rerank_head
        # llama-server's id is the first alias in order (its aliases are a std::set)
        self.name = self.options.name or (min(self.options.aliases) if self.options.aliases else planned.path.stem)
        self.socks = socks if socks is not None else bind_all(self.options.hosts, self.options.port)
        self.port = self.socks[0].getsockname()[1]
        self.built: Built | None = None
        self.loaded: runtime.Loaded | None = model if isinstance(model, runtime.Loaded) else None
        self._owns_model = not isinstance(model, runtime.Loaded)
        self._engines: list[Any] = []  # the engine a load made, closed after serving even when a signal stops the load midway
        self._switch: Any = None
        self._thread: threading.Thread | None = None
        self._failed: list[BaseException] = []
        self.outcome: Any = None  # lifecycle.Server once stopped: signalled, aborted
        self._main = True
        self._metrics = ServerMetrics()  # across sleeps (serve/sleep.py): the counters go on
        self.sleeper: Any = None

    @property
    def urls(self) -> list[str]:
        return [f"http://{shown(s.getsockname()[0])}:{self.port}/v1" for s in self.socks]

    @property
    def url(self) -> str:
        """The first address's OpenAI base URL."""
        return self.urls[0]

    @property
    def requests(self) -> int:
        return self._switch.requests if self._switch is not None else 0

    def _load(self) -> None:
        """In the loader thread: the model (when not loaded already), then the app."""
        if self.loaded is None:
            assert isinstance(self.model, runtime.Planned)
            engine = runtime.new_engine(serving=True)
            self._engines.append(engine)
            self.loaded = runtime.load(self.model, engine)
        loaded = self.loaded
        if loaded.projector is not None:
            wiring.check_projector(loaded.engine, loaded.projector.path)
            self.say(f"{'vision' if loaded.projector.has_vision else 'audio'}: {loaded.projector.line()}")
        if self._switch.stopped:  # stopped by a signal while loading
            return
        built = build(loaded, self.options, self.name, rerank_head=self.rerank_head, metrics=self._metrics)
        self.built = built
        if self.options.sleep_idle_s is not None and self._owns_model:
            from localllm.serve.sleep import Sleeper  # lazy: only a server that sleeps

            self.sleeper = Sleeper(built.app, self.options.sleep_idle_s, unload=self._unload, load=self._reload, metrics=self._metrics,
                                   metrics_endpoint=self.options.metrics, api_key=self.options.api_key)
            front = self.sleeper
        else:
            front = built.app
        from localllm.serve.cors import with_cors  # lazy: Starlette's middleware, once serving

        self._switch.app = with_cors(front, self.options.cors)  # answers asleep get their CORS headers too
        self.say(self.serving_line())

    def _unload(self) -> None:
        """Asleep: the scheduler stopped and the model freed (the sockets and the app stay)."""
        if self.built is not None:
            self.built.scheduler.stop()
        if self.loaded is not None:
            self.loaded.close()
        self.built = self.loaded = None
        self.say(f"asleep after {self.options.sleep_idle_s:g} s idle: {self.name} freed, loaded again by the next request")

    def _reload(self) -> Any:
        """Awake: the same plan loaded again and the app rebuilt over it; the new app."""
        assert isinstance(self.model, runtime.Planned)
        engine = runtime.new_engine(serving=True)
        self._engines.append(engine)
        self.loaded = runtime.load(self.model, engine)
        self.built = build(self.loaded, self.options, self.name, rerank_head=self.rerank_head, metrics=self._metrics)
        self.say(f"awake: {self.name} loaded again")
        return self.built.app

    def serving_line(self) -> str:
        """What is served, how: said once the model answers."""
        assert self.built is not None and self.loaded is not None
        b, o, info = self.built, self.options, self.built.info
        parallel = max(self.loaded.planned.request.parallel, 1)
        context = fitting.context_choice(self.loaded.planned.fit, parallel)
        cache = ""
        if b.cache is not None:
            limit = "no byte limit" if b.cache.max_bytes is None else f"up to {b.cache.max_bytes // 2**20} MiB"
            cache = f", idle prompts to RAM ({limit}, {b.cache.max_tokens} tokens)"
        rank = o.rerank or o.pooling == "rank"
        images = f", images through {self.loaded.projector.path.name}" if self.loaded.projector is not None else ""
        return (f"serving {self.name} on {' and '.join(self.urls)} ({parallel} parallel, {b.n_ctx_seq} tokens per request ({context.reason}), "
                f"KV pool {info.n_ctx} cells {info.type_k}/{info.type_v}, prefix reuse {'on' if info.prefix_reuse else 'off'}"
                f"{cache}{', reranking on /v1/rerank' if rank else ''}{images}{', API key required' if o.api_key else ''})"
                f"{'; Ctrl+C stops' if self._main else ''}")

    def abort(self, reason: str) -> int:
        """End the running requests with an error naming ``reason`` (the stop's grace is over, a worker is gone); how many."""
        return self.built.scheduler.abort(reason) if self.built is not None else 0

    @property
    def switch(self) -> Any:
        """lifecycle's ``Switch``: requests counted, the model lost, the sockets to hand over."""
        return self._switch

    def run(self, *, before: Callable[[Any], None] | None = None) -> Any:
        """Serve until stopped (SIGINT/SIGTERM in the main thread, or ``stop()``);
        ``before(switch)``: called once the sockets are set, before serving
        (the command's --rpc recovery). Returns lifecycle's server (its
        ``signalled`` and ``aborted``)."""
        from localllm.serve.lifecycle import Switch, serve  # lazy: uvicorn, once a server starts

        self._switch = Switch()
        self._main = threading.current_thread() is threading.main_thread()  # signals stop it only there
        if self.loaded is None:
            self.say(f"listening on {' and '.join(self.urls)}: loading {self.name} (requests get 503 'Loading model' until it is loaded)")
        if before is not None:
            before(self._switch)
        try:
            self.outcome = serve(self._switch, self.socks, self._load, self.abort, header_timeout=self.options.header_timeout)
        finally:
            self._close()
        return self.outcome

    def _close(self) -> None:
        if self.sleeper is not None:
            self.sleeper.close()
        if self._switch is not None and self._switch.lost is not None:
            return  # the engine thread is held in llama.cpp: it cannot be stopped, nor the model freed
        if self.built is not None:
            self.built.scheduler.stop()
        if self._owns_model:
            for engine in self._engines:
                engine.close()
        for sock in self.socks:
            sock.close()

    def start(self) -> Server:
        """Serve in a thread of this process and return once the model answers
        (``/health`` is 200); ``stop()`` (or ``with``) ends it."""
        ready = threading.Event()

        def main() -> None:
            try:
                self.run()
            except BaseException as exc:  # raised again by start(), or by stop()
                self._failed.append(exc)
            finally:
                ready.set()

        self._thread = threading.Thread(target=main, name="localllm-serve", daemon=True)
        self._thread.start()
        while not ready.wait(0.02):
            if self.built is not None:
                break
        if self._failed:
            raise self._failed[0]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving (running requests get the grace lifecycle gives them) and wait."""
        if self._switch is not None:
            self._switch.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._failed:
            raise self._failed[0]

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(model: runtime.Loaded | runtime.Planned, options: ServeOptions | None = None) -> None:
    """Serve ``model`` until SIGINT or SIGTERM (from the main thread): the blocking
    form of ``Server(model, options).run()``."""
    Server(model, options).run()
