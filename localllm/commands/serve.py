"""``localllm serve``: the fitted model behind an OpenAI-compatible HTTP API.

The KV cache is one pool of ``--ctx`` x ``--parallel`` cells (llama.cpp's
unified cache, ``n_seq_max`` = ``--parallel``), planned and fitted as ``run``
plans a context of that many tokens; each request may use up to ``--ctx``.

With no MODEL (or ``--models``), serve is a router (``localllm.router``): every
model of ``localllm list`` by name, each loaded on demand in a ``serve MODEL``
process of its own, which gets the per-model options given here.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from localllm import api, reasoning, runtime
from localllm.commands import serve_flags, vision_cli
from localllm.commands._common import fit_request, load_request, model_path, plan_load, sampling_config, say
from localllm.commands.serve_models import PerModel, preset_of
from localllm.errors import InputError, LocalLLMError, UsageError
from localllm.plan import fitting, hardware, planner
from localllm.serve import media, thinking, tools
from localllm.serve.prometheus import ServerMetrics
from localllm.serve.prompt_cache import PromptCache
from localllm.serve.protocol import RequestError
from localllm.serve.scheduler import Scheduler
from localllm.store import registry, resolver
from localllm.util import fmt
from localllm.util.net import is_loopback
from localllm.util.units import Size


def _bind(host: str, port: int) -> socket.socket:
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


def run(args: argparse.Namespace) -> int:
    if args.api_key is not None and not args.api_key.strip():
        # an empty key would silently mean "no authentication": refuse it rather than guess
        raise UsageError("--api-key is empty: give a key (e.g. \"$(openssl rand -hex 16)\"), or leave --api-key out to serve without one")
    api_key = args.api_key or os.environ.get("LOCALLLM_API_KEY") or None
    template_defaults(args, None)  # a bad --chat-template-kwargs is said before any model loads
    hosts = _hosts(args.host)
    for host in hosts:
        if not is_loopback(host) and not api_key:
            say(f"warning: listening on {host} without --api-key: anyone who can reach this address can use the model")
    if args.model is None or getattr(args, "models", None) is not None:
        if getattr(args, "mcp_servers_config", None) or getattr(args, "mcp_servers_json", None):
            raise UsageError("--mcp-servers-config and --mcp-servers-json go with serve MODEL (one model), not the router")
        return _route(args, api_key, hosts)
    if getattr(args, "models_preset", None) is not None:
        raise UsageError("--models-preset sets the options of the models serve with no MODEL serves: give it without a MODEL")
    path = model_path(args)
    rerank = args.rerank or args.pooling == "rank"
    head = True
    if rerank:
        head = _check_reranker(path)
        if getattr(args, "mmproj", None):
            raise UsageError("--mmproj goes with a model that generates, not with --rerank")
    # --mmproj, else a projector beside the model (as run finds it; --no-mmproj: none): checked against the model now,
    # one line naming both files, before anything listens
    mmproj = None if rerank else vision_cli.projector_path(args, path)
    parallel = args.parallel
    if parallel > 256:  # LLAMA_MAX_SEQ (src/llama-cparams.h)
        raise UsageError("--parallel can be at most 256 (llama.cpp's LLAMA_MAX_SEQ)")
    if args.batch < parallel:
        raise UsageError(f"--batch {args.batch} cannot hold one token of each of --parallel {parallel} sequences: raise --batch")
    # --ctx is each sequence's; with none, the plan's default (fitting.for_header): the trained context for each, fitted
    request = load_request(args, path, args.ctx * parallel if args.ctx else None, n_seq=parallel, serving=True, projector=mmproj,
                           template=args.template)
    planned = plan_load(args, request).check()  # does not fit (the model, or its projector beside it): one line, before listening
    fitted = planned.lp
    n_ctx_seq = fitted.config.n_ctx // parallel
    context = fitting.context_choice(fitted.fit, parallel)  # said at start and on /api/ps
    if n_ctx_seq < 16:
        raise InputError(f"{parallel} sequences leave {n_ctx_seq} tokens each: lower --parallel or raise --vram")
    if fitted.fit.outcome is not fitting.Outcome.FITS_AS_ASKED or args.vram is not None:
        c = fitted.config
        say(f"fitted to {'--vram ' + fmt.size(args.vram) if args.vram else 'this machine'}: context {c.n_ctx} ({n_ctx_seq} per sequence), "
            f"KV {c.type_k}/{c.type_v}, {fitted.fit.plan.n_gpu_layers} layers on the GPU ({fitted.fit.sentence})")
    mcp_hub = None
    if getattr(args, "mcp_servers_config", None) or getattr(args, "mcp_servers_json", None):
        from localllm.commands.serve_mcp import hub_from_flags  # lazy: localllm.mcp, only with --mcp-servers-*

        mcp_hub = hub_from_flags(args, say)
    # lazy: loads Starlette and uvicorn (~64 ms here), which serve does not load at import
    from localllm.serve.lifecycle import Switch, exec_fresh, inherited_sockets, recover_lost_workers, serve

    socks = inherited_sockets() or _bind_all(hosts, args.port)  # inherited: this process replaced one that lost its model
    port = socks[0].getsockname()[1]
    urls = " and ".join(f"http://{_shown(s.getsockname()[0])}:{port}/v1" for s in socks)
    name = args.alias or (path.stem if args.model and resolver.looks_like_path(args.model) else args.model or resolver.DEFAULT_MODEL)
    say(f"listening on {urls}: loading {name} (requests get 503 'Loading model' until it is loaded)")
    switch = Switch()
    running: list[Scheduler] = []
    models: list = []  # the BatchModel once the loader thread has made it, closed after serving

    def load() -> None:
        from localllm.commands.serve_facts import model_facts  # lazy: with the engine below, once loading
        from localllm.engine.batch import BatchModel  # lazy: loads llama.cpp, in the loader thread while the sockets already answer
        from localllm.serve.app import ServeState, build_app  # lazy: loads Starlette's routing, needed once loaded
        from localllm.serve.cors import with_cors  # lazy: Starlette's middleware, as above
        from localllm.serve.handoff import ENGINE  # lazy: asyncio, which the app above loads anyway

        model = BatchModel()
        models.append(model)  # closed after serving, even when a signal stops the load midway
        # the load path: the pool of n_ctx_seq x parallel cells, --lora (counted by the fit), the projector, --template
        loaded = runtime.load(planned, model)
        info, adapters = loaded.info, loaded.adapters
        if mmproj is not None:
            _check_projector(model, mmproj, loaded.projector)
        if switch.stopped:  # stopped by a signal while loading
            return
        metrics = ServerMetrics()
        metrics.kv_cells_total = info.n_ctx
        # with adapters, a stored state would need its adapter scales along: none kept in RAM (prefix reuse in the KV cache stays)
        cache = (PromptCache(max_bytes=None if args.cache_ram < 0 else args.cache_ram * 2**20, max_tokens=info.n_ctx)
                 if args.cache_ram and info.prefix_reuse and not adapters else None)
        scheduler = Scheduler(model, n_seq=parallel, n_ctx_seq=n_ctx_seq, n_batch=info.n_batch, prefix_reuse=info.prefix_reuse,
                              max_queue=args.max_queue, prefill_chunk=args.prefill_chunk, metrics=metrics, prompt_cache=cache,
                              handoff=ENGINE, adapters=adapters, n_swa=info.n_swa)
        scheduler.start()  # before the embeddings: --embeddings opens their context on the engine thread
        running.append(scheduler)
        state = ServeState(scheduler=scheduler, metrics=metrics, model_name=name, n_ctx_seq=n_ctx_seq, n_vocab=info.n_vocab,
                           check_grammar=model.check_grammar,
                           embeddings=_embeddings(model, n_ctx_seq, None if rerank else args.pooling, scheduler.run, at_start=args.embeddings),
                           rerank=_rerank(model, n_ctx_seq, scheduler, head) if rerank else None,
                           no_generation=None if model.can_generate else NO_GENERATION,
                           tool_format=tools.detect(model.tok.template.source(model.tok.header)),
                           reasoning=reasoning.markers(model.tok.template.source(model.tok.header))[0],
                           reasoning_format="deepseek" if args.reasoning_format == "auto" else args.reasoning_format,
                           # the prompt's last text tokens (an image's filler ids are no tokens)
                           prompt_tail=lambda tokens: b"".join(model.tok.token_bytes(t, special=True) for t in [t for t in tokens[-40:] if t >= 0][-8:])
                           .decode("utf-8", "replace"),
                           vision=mmproj is not None, **({"max_body": media.MEDIA_BODY} if mmproj is not None else {}),
                           tokenize=_tokenizer(model, template_defaults(args, model)), api_key=api_key, json_log=args.json,
                           defaults=sampling_config(args), facts=model_facts(model, path, parallel, args.template, n_batch=args.batch,
                                                                                   spm_infill=args.spm_infill, context=str(context),
                                                                                   extra=template_defaults(args, model)),
                           metrics_endpoint=args.metrics, slots_endpoint=args.slots, mcp=mcp_hub, slot_save_path=args.slot_save_path)
        switch.app = with_cors(build_app(state), tuple(args.cors or ()))
        say(f"serving {name} on {urls} ({parallel} parallel, {n_ctx_seq} tokens per request ({context.reason}), "
            f"KV pool {info.n_ctx} cells {info.type_k}/{info.type_v}, prefix reuse {'on' if info.prefix_reuse else 'off'}"
            f"{_cache_words(cache)}{', reranking on /v1/rerank' if rerank else ''}"
            f"{f', images through {mmproj.name}' if mmproj is not None else ''}"
            f"{', API key required' if api_key else ''}); Ctrl+C stops")

    def abort(reason: str) -> int:
        return sum(s.abort(reason) for s in running)

    if args.rpc:
        recover_lost_workers(switch, socks, abort, args.rpc)
    try:
        server = serve(switch, socks, load, abort, header_timeout=args.timeout)
    finally:
        if switch.lost is None:  # else the engine thread is held in llama.cpp: it cannot be stopped, nor the model freed
            for s in running:
                s.stop()
            for m in models:
                m.close()
        for sock in socks:
            sock.close()
        if mcp_hub is not None:
            mcp_hub.close()
    cut = f" ({server.aborted} ended early by the stop)" if server.aborted else ""
    if switch.handover_fds and not server.signalled:
        say(f"the workers answer again: restarting to load the model ({switch.requests} request(s) so far)")
        exec_fresh(switch.handover_fds)
    say(f"stopped after {switch.requests} request(s){cut}")
    if switch.lost is not None:
        os._exit(1)  # llama.cpp's held threads would keep a normal exit waiting for good
    if os.environ.get(ROUTER_CHILD) == "1":  # the model is freed and the sockets closed: nothing is left to finish, and the
        sys.stdout.flush()  # interpreter's own teardown (its modules, llama.cpp's threads) took 0.35 s of a model switch here
        sys.stderr.flush()
        os._exit(0)
    return 0


def _route(args: argparse.Namespace, api_key: str | None, hosts: list[str]) -> int:
    """Router mode: serve the models of ``localllm list`` by name (``localllm.router``)."""
    # lazy: the router's catalog, durations and memory plan, for router mode only (its server below loads Starlette, uvicorn and httpx2)
    from localllm.router import catalog, durations, residency

    if args.model is not None:
        raise UsageError(f"--models serves models by name: give --models or a MODEL ({args.model}), not both")
    if args.alias is not None:
        raise UsageError("--alias names the one model of serve MODEL: with no MODEL each model is served by its name in localllm list")
    if getattr(args, "lora", None) or getattr(args, "lora_init_without_apply", False):
        raise UsageError("--lora adapters are for one base model: give serve a MODEL with them")
    if getattr(args, "mmproj", None):
        raise UsageError("--mmproj names one model's projector: give serve a MODEL with it (with no MODEL, each model's own "
                         "projector beside it is found; --no-mmproj turns that off)")
    if args.parallel > 256:  # LLAMA_MAX_SEQ (src/llama-cparams.h); checked here too, so a bad value is found now, not per model
        raise UsageError("--parallel can be at most 256 (llama.cpp's LLAMA_MAX_SEQ)")
    if args.batch < args.parallel:
        raise UsageError(f"--batch {args.batch} cannot hold one token of each of --parallel {args.parallel} sequences: raise --batch")
    keep_alive = _keep_alive(args, durations)
    only = None
    wanted = [n.strip() for n in (args.models or "all").split(",")]
    if not all(wanted):
        raise UsageError("--models has an empty name: give all, or names from localllm list separated by commas")
    if "all" not in (n.lower() for n in wanted):
        only = tuple(catalog.served_names(wanted, registry.discover()))
    from localllm.router.server import Settings  # lazy: Starlette, uvicorn and httpx2 (~0.1 s), for router mode only
    from localllm.router.server import run as route  # lazy: as above

    per = PerModel(args, preset_of(args, serve_flags.refused()), serve_flags.refused())
    per.check()
    if per.preset is not None:  # a section for no model would be options for nothing, silently (issue 64)
        entries = registry.discover()
        stray = [n for n in per.preset.models if registry.find(n, entries) is None]
        if stray:
            raise UsageError(f"{per.preset.path}: [{stray[0]}] names no model of localllm list: name one (localllm list shows them), "
                             "or use [*] for every model")
    autoload = [n for n in (args.default_model, *(per.preset.on_startup if per.preset else ())) if n]
    autoload = catalog.served_names(autoload, registry.discover()) if autoload else []
    if only is not None:
        only = (*only, *(n for n in autoload if n not in only))  # a model loaded at start is served
    memory = _memory(args, residency, per)

    def options(name: str) -> tuple[str, ...]:
        """``name``'s child's options: its own layers (``PerModel``), and the GPU budget the router planned it with."""
        out = child_options(per.args(name))
        if memory is not None and memory.budget.gpu is not None and per.args(name).vram is None:
            out.append(f"--vram={memory.budget.gpu}B")  # each child fits to the budget the router planned it with, not to what its siblings leave
        return tuple(out)

    settings = Settings(only=only, models_max=args.models_max, keep_alive=keep_alive, max_waiting=args.max_queue, api_key=api_key,
                        cors=tuple(args.cors or ()), json_log=args.json,
                        top=(("-v",) if args.verbose else ()) + (("--debug",) if args.debug else ()),
                        options=options(""), per_model=options, autoload=tuple(autoload), memory=memory,
                        models_autoload=args.models_autoload, reload=per.reload, header_timeout=args.timeout)
    socks = _bind_all(hosts, args.port)
    try:
        return route(socks, settings, say)
    finally:
        for sock in socks:
            sock.close()


def _memory(args: argparse.Namespace, residency, per):
    """The router's memory plan (``residency.Memory``): each model fitted as
    ``serve MODEL`` fits it (``run``'s rules: the same options, ``--ctx`` per
    sequence, the trained context by default (``fitting.for_header``), ``--parallel``
    sequences), alone, against this machine as it was when the router started:
    the GPU budget (``--vram``, or the device's free memory then, passed on to
    each child as ``--vram``) and the RAM available then, before any model. With
    ``--rpc`` None: the workers' devices are theirs to budget, and each child
    fits to them on its own, as before (``--models-max`` alone decides)."""
    if getattr(args, "rpc", None):
        return None
    import psutil  # lazy: router mode only (hardware.detect loads it too)

    hw = hardware.detect(args.vram)
    gpu = hw.gpu_budget
    budget = residency.Budget(gpu=gpu, margin=planner.default_margin(gpu) if gpu is not None else 0, ram=hw.ram_available_bytes)

    def plan(path, name: str = ""):
        mine = per.args(name)  # the model's own options (its config table, its preset section)
        parallel = mine.parallel
        n_ctx = mine.ctx * parallel if mine.ctx else None  # None: the plan's default, as serve MODEL asks (run above)
        request = fit_request(mine, n_ctx)
        lp = api.prepare(path, request, hw=hw, n_ctx=n_ctx, n_seq=parallel, dry_run=not mine.no_dry_run, serving=True)
        if lp.refits:
            say(f"{path.name}: llama.cpp's dry run needs a larger compute buffer than estimated: refitted ({lp.fit.sentence})")
        return lp

    return residency.Memory(budget=budget, plan=plan, ram_now=lambda: psutil.virtual_memory().available)


def _keep_alive(args: argparse.Namespace, durations) -> float | None:
    """How long an idle model stays loaded: --keep-alive (Ollama's), --sleep-idle-seconds
    (llama-server's), OLLAMA_KEEP_ALIVE, else Ollama's 5 minutes; None: for ever."""
    typed, idle = getattr(args, "keep_alive", None), getattr(args, "sleep_idle_seconds", None)
    if typed is not None and idle is not None:
        raise UsageError("--keep-alive and --sleep-idle-seconds set the same thing: give one")
    if idle is not None:
        return None if idle < 0 else float(idle)
    text, where = (typed, "--keep-alive") if typed is not None else (os.environ.get("OLLAMA_KEEP_ALIVE") or "5m", "OLLAMA_KEEP_ALIVE")
    try:
        return durations.parse(text)
    except durations.BadDuration as exc:
        raise UsageError(f"{where}: {exc}") from None


ROUTER_CHILD = "LOCALLLM_ROUTER_CHILD"  # set by the router (router.children.Spawn) in each model's process


# serve's options that are the router's alone: each child listens on loopback with the internal key, under its name
ROUTER_ONLY = frozenset({"model", "model_flag", "yes", "no_pull", "host", "port", "api_key", "alias", "models", "models_max", "keep_alive",
                         "models_preset", "default_model", "models_autoload",
                         "sleep_idle_seconds", "cors", "help"})


def child_options(args: argparse.Namespace) -> list[str]:
    """The serve options given (typed or from the config file) that apply to each
    model, as a child's command line: each option that differs from its default,
    as ``--flag=value`` (a negative value cannot pass for a flag)."""
    parser = (getattr(args, "subparsers", None) or {}).get("serve")
    if parser is None:
        raise UsageError("serve with no MODEL runs from the command line (localllm serve), which knows its options")
    out: list[str] = []
    by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of a parser's options
        if action.option_strings and action.help != argparse.SUPPRESS and action.dest not in ROUTER_ONLY:
            by_dest.setdefault(action.dest, []).append(action)
    for dest, actions in by_dest.items():
        value = getattr(args, dest, None)
        if value == parser.get_default(dest) or (value is None):
            continue
        flagged = [a for a in actions if a.nargs == 0 and a.const == value]
        if flagged:
            out.append(_long(flagged[0]))
            continue
        valued = next((a for a in actions if a.nargs != 0), None)
        if valued is None:
            continue
        repeated = isinstance(value, list) and all(isinstance(v, str) for v in value)  # an option given several times
        out += [f"{_long(valued)}={_text(item)}" for item in (value if repeated else [value])]
    return out


def _long(action: argparse.Action) -> str:
    return next((s for s in action.option_strings if s.startswith("--")), action.option_strings[0])


def _text(value: object) -> str:
    """A parsed option value as text its option parses back to the same value."""
    if isinstance(value, Size):
        return f"{int(value)}B"  # bytes, exactly (a bare number would be GiB)
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))  # --rpc's endpoints
    return repr(value) if isinstance(value, float) else str(value)


def _bind_all(hosts: list[str], port: int) -> list[socket.socket]:
    """One listening socket per --host; with --port 0 the others take the port the first got."""
    socks = [_bind(hosts[0], port)]
    port = socks[0].getsockname()[1]
    try:
        socks += [_bind(h, port) for h in hosts[1:]]
    except Exception:
        for sock in socks:
            sock.close()
        raise
    return socks


def _hosts(given: list[str] | None) -> list[str]:
    """``--host`` repeated or comma-separated, as llama-server's list; each once."""
    hosts = [h.strip() for value in (given or ["127.0.0.1"]) for h in value.split(",")]
    if not all(hosts):
        raise UsageError("--host has an empty address")
    return list(dict.fromkeys(hosts))


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _cache_words(cache: PromptCache | None) -> str:
    if cache is None:
        return ""
    limit = "no byte limit" if cache.max_bytes is None else f"up to {cache.max_bytes // 2**20} MiB"
    return f", idle prompts to RAM ({limit}, {cache.max_tokens} tokens)"


def _embeddings(model, n_ctx: int, pooling: str | None, run, *, at_start: bool):
    """/v1/embeddings on the served model (its embedding context is made on first use, or now with ``at_start``: --embeddings).
    ``run`` makes the embedder's llama.cpp calls: the scheduler's engine thread (``Scheduler.run``, in serve/scheduler.py's docstring why)."""
    from localllm.serve.embeddings import Embeddings  # lazy: with Starlette (~64 ms), which serve loads only once it starts

    emb = model.embedder(n_ctx, pooling)
    if at_start:
        emb.open(run)
    return Embeddings(tokenize=lambda text: model.tok.tokenize(text, add_special=True, parse_special=False),
                      embed=lambda inputs: emb.embed(inputs, run),
                      n_ctx=emb.n_ctx, n_vocab=model.tok.n_vocab, n_embd=emb.n_embd, pooling=emb.pooling)


HEAD_TENSORS = ("cls.weight", "cls.output.weight")  # llama.cpp's LLM_TENSOR_CLS and LLM_TENSOR_CLS_OUT (src/llama-arch.cpp)
NO_GENERATION = ("this model cannot generate text: llama.cpp computes no logits for it (an encoder such as BERT, with no KV cache); "
                 "it serves /v1/embeddings, and /v1/rerank with --rerank")


def _check_reranker(path) -> bool:
    """Whether the GGUF has a classification head. Without one, llama-server's rank
    pooling scores a pair by the first component of the first token's hidden state:
    numbers that rank nothing. serve answers as llama-server does (clients and its
    tests rely on the route), but says so at start and on every answer
    (``X-Rerank-Head: none``)."""
    from localllm.modelfile.gguf_file import read_header  # lazy: as inspect_model, only on this path

    header = read_header(path)
    names = {t.name for t in header.tensors}
    if any(t in names for t in HEAD_TENSORS):
        return True
    say(f"warning: {path.name} has no classification head (no cls or cls.output tensors): /v1/rerank answers as llama-server does, "
        "but its scores rank nothing (each answer says X-Rerank-Head: none); a reranker GGUF (bge-reranker, jina-reranker, "
        "Qwen3-Reranker) gives real ones")
    return False


def _rerank(model, n_ctx: int, scheduler, head: bool = True):
    """/v1/rerank on the served model: its rank context (engine/rank.py), opened now so that a failure shows at start.
    Its decodes run on the scheduler's engine thread, as the embeddings' (``Scheduler.call``: the route awaits them)."""
    import functools

    from localllm.serve.rerank import Rerank  # lazy: with Starlette, as _embeddings

    ranker = model.ranker(n_ctx)
    ranker.open(scheduler.run)
    return Rerank(pair=lambda query, doc: ranker.pair(query, doc, model.tok.tokenize), batches=ranker.batches,
                  decode=lambda groups: scheduler.call(functools.partial(ranker.decode_slice, groups)), n_ctx=ranker.n_ctx, head=head)


def template_defaults(args: argparse.Namespace, model) -> dict:
    """serve's template variables: ``enable_thinking`` (--reasoning) and --chat-template-kwargs
    (serve/thinking.py); ``model`` None: only checks them, before a model is loaded."""
    has_thinking = model is not None and reasoning.markers(model.tok.template.source(model.tok.header))[0] is not None
    try:
        return thinking.defaults(args.reasoning, has_thinking, args.chat_template_kwargs)
    except thinking.KwargsError as exc:
        raise UsageError(str(exc)) from None


def _check_projector(model, path, info) -> None:
    """The projector the load path loaded on the model: refused at start when an image
    would not fit one ubatch where libmtmd decodes it whole (Gemma 3's: every request would fail)."""
    from localllm.vision.image import RGBImage  # lazy: as the projector, only for a vision model

    mp = model.image_prompt(RGBImage(name="probe", width=8, height=8, rgb=bytes(8 * 8 * 3), file_bytes=0, sha256="probe"))
    try:
        for piece in mp.pieces:
            n_ubatch = model.image_too_large(piece) if piece.is_image else None
            if n_ubatch is not None:
                raise UsageError(f"an image is {piece.n_tokens} tokens through {path.name}, decoded in one ubatch, but --ubatch is {n_ubatch}: "
                                 f"serve it with --ubatch {piece.n_tokens} (and --batch at least that)")
    finally:
        mp.close()
    say(f"vision: {vision_cli.describe(info)}")


def _tokenizer(model, extra: dict):

    tok = model.tok

    def tokenize(params) -> list[int]:
        if params.images:
            return _image_tokens(model, params, runs)
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

    def runs(params, marks: list[str]) -> tuple[list[list[int]], list[int]]:
        """The prompt's text, cut where the images' marks stand (as ``tokenize`` reads it)."""
        if tok.has_chat_template:
            return tok.chat_runs(params.messages, marks, tools=params.tools.template_tools if params.tools else None,
                                 extra=thinking.merged(extra, params.template_kwargs), continue_final=params.continue_final,
                                 add_generation_prompt=params.add_generation_prompt)
        text = "".join(f"{m['role']}: {m['content']}\n" for m in params.messages) + "assistant:"
        return tok.text_runs(text, marks)

    return tokenize


def _image_tokens(model, params, runs) -> media.MediaTokens:
    """A prompt with images (in a worker thread): each picture decoded and bounded
    (``vision.image``), placed where its part was, and split into libmtmd's chunks;
    each problem a 400 naming the part."""
    from localllm.vision.image import decode_image  # lazy: Pillow, only for a request with images

    first = params.images[0]
    if model.projector is None:
        raise RequestError(400, f"'{first.where}' is an image, but this server's model reads text only: start serve with --mmproj FILE "
                           "(the model's vision projector; one beside the model is found without it)", param=first.where)
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
            pictures[k] = decode_image(media.picture_bytes(im), name=im.where)
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
