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
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localllm import flags, speculation
from localllm.commands import serve_flags
from localllm.commands._common import fit_request, load_request, model_path, plan_load, say
from localllm.commands.serve_models import PerModel, preset_of
from localllm.errors import InputError, UsageError
from localllm.util import fmt
from localllm.util.net import is_loopback
from localllm.util.units import Size

if TYPE_CHECKING:
    from localllm.flags import Subparsers


def register(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server with continuous batching (loopback by default)",
                       description="serve MODEL serves one model; with no MODEL, every model of localllm list by name, each loaded "
                       "on demand in a process of its own and unloaded when idle (as Ollama and llama-server's router do).")
    flags.add_model(p, default="every model of localllm list, by name, loaded on demand")
    flags.add_pull_options(p)
    p.add_argument("--host", action="append", default=None, metavar="HOST[,HOST]",
        help="address(es) to listen on, repeatable or comma-separated (default: 127.0.0.1; another one warns without --api-key)")
    p.add_argument("--port", type=flags.port, default=8080, help="TCP port, 0 for any free one (default: 8080)")
    p.add_argument("--parallel", "-np", type=flags.int_at_least(1, "--parallel"), default=serve_flags.DEFAULT_PARALLEL, metavar="N",
        help=f"sequences decoded together; the KV cache holds N x --ctx (default: {serve_flags.DEFAULT_PARALLEL})")
    p.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY' (also: LOCALLLM_API_KEY)")
    p.add_argument("--alias", default=None, metavar="NAME[,NAME]",
                   help="the model's name in the API (default: the name given); several: all listed, the first in order is its id (llama-server's)")
    p.add_argument("-to", "--timeout", type=flags.float_in(0, 3600, "--timeout", above=True), default=None, metavar="S",
        help="seconds a client has to send a request's head before a 408 closes the connection (default: 10, a bound on "
             "half-sent requests; the whole request gets at least 60) (llama-server's name)")
    p.add_argument("--max-queue", type=flags.int_at_least(1, "--max-queue"), default=64, metavar="N",
                   help="requests waiting for a slot before 429 (default: 64)")
    p.add_argument("--prefill-chunk", type=flags.int_at_least(1, "--prefill-chunk"), default=128, metavar="N",
        help="prompt tokens per step while others generate (default: 128)")
    p.add_argument("--cache-ram", type=flags.int_at_least(-1, "--cache-ram", 2**40), default=8192, metavar="MIB",
        help="idle requests' prompts kept in RAM, out of the KV cache, up to MIB and the KV pool's tokens "
             "(llama-server's flag; -1: no byte limit, 0: off, idle prompts stay in the KV cache; default: 8192)")
    p.add_argument("--embeddings", action="store_true",
        help="make /v1/embeddings' context at start, not at the first request (llama-server's flag; embeddings are always served beside chat)")
    p.add_argument("--pooling", choices=("mean", "last", "cls", "rank", "none"), default=None,
        help="how /v1/embeddings pools a sequence (default: what the model declares, else mean); rank: as --rerank; "
             "none: no pooling, so the embedding routes answer 400, as llama-server's /v1/embeddings does")
    p.add_argument("--rerank", "--reranking", action="store_true",
        help="serve /v1/rerank with the model's classification head (llama-server's flag: rank pooling; a reranker GGUF is needed)")
    flags.add_load_options(p, ctx_help=f"each request's context in tokens; the KV cache holds --parallel of them (default: {flags.SERVE_CTX})")
    flags.add_lora(p)
    flags.add_vision(p, image=False)  # requests' images (serve/media.py)
    flags.add_sampling(p)  # the defaults of a request's omitted fields, as llama-server's --temp, --seed, -n ...
    flags.add_speculate(p)
    p.add_argument("--compact-at", type=flags.compact_at, default=None, metavar="FRACTION|off",
                   help="a chat request whose prompt fills this much of a slot's context (0.85, 85%%) has its older turns "
                        "replaced by a summary the model writes, kept for the conversation's next requests (default: off)")
    flags.add_template(p)
    serve_flags.add(p)
    p.add_argument("--json", action="store_true", help="the request log as one JSON object per line (stderr)")
    r = p.add_argument_group("router (serve with no MODEL)")
    r.add_argument("--models", default=None, metavar="all|NAME[,NAME]",
        help="serve these models of localllm list by name, each loaded on demand (default with no MODEL: all)")
    r.add_argument("--models-max", type=flags.int_at_least(0, "--models-max"), default=4, metavar="N",
        help="models loaded at once; the least recently used idle one is unloaded to load another (llama-server's flag; 0: no cap; default: 4)")
    idle = r.add_mutually_exclusive_group()
    idle.add_argument("--keep-alive", default=None, metavar="DURATION",
        help="how long an idle model stays loaded: 30s, 5m, 1h, seconds; -1 for ever, 0 unload after each request "
             "(Ollama's; a request's keep_alive wins; also OLLAMA_KEEP_ALIVE; default: 5m; with a MODEL: off unless given, "
             "and the next request loads it again)")
    idle.add_argument("--sleep-idle-seconds", type=flags.int_at_least(-1, "--sleep-idle-seconds"), default=None, metavar="N",
        help="llama-server's name for --keep-alive, in seconds (-1: for ever); with a MODEL the server sleeps: /health, /props, "
             "/models and /metrics answer without waking it, any other request loads the model again")
    r.add_argument("--models-preset", default=None, metavar="FILE",
        help="a llama-server presets INI: [*] for every model, [NAME] for one (llama-server's option names, "
             "load-on-startup = true loads it at start); what is typed wins, then the model's section, then [*], then the config file")
    r.add_argument("--models-autoload", action=argparse.BooleanOptionalAction, default=True,
        help="load a model when a request names it (llama-server's flag; with --no-models-autoload only POST /models/load does, "
             "and a request for a model not loaded is a 400; default: on)")
    r.add_argument("--default-model", default=None, metavar="NAME", help=argparse.SUPPRESS)  # the config file's model: loaded at start and kept
    p.set_defaults(subparsers=None, typed_argv=None)  # cli.main and cli._parse set them: the router re-parses each model's options


@dataclass(frozen=True)
class Options:
    """serve's options, typed; ``namespace`` is the parsed one, for what walks serve's
    parser by destination (``child_options``, the router's ``PerModel``)."""

    model: str | None
    pull: flags.Pull
    host: tuple[str, ...] | None
    port: int
    parallel: int
    api_key: str | None
    alias: str | None
    timeout: float | None
    max_queue: int
    prefill_chunk: int
    cache_ram: int
    embeddings: bool
    pooling: str | None
    rerank: bool
    load: flags.Load
    lora: flags.Lora
    vision: flags.Vision
    sampling: flags.Sampling
    speculate: str
    compact_at: float | None
    template: str | None
    metrics: bool
    slots: bool
    spm_infill: bool
    reasoning_format: str
    reasoning: str
    chat_template_kwargs: str | None
    mcp_servers_config: str | None
    mcp_servers_json: str | None
    tools: str | None
    media_path: Path | None
    tags: str | None
    verbose_replies: bool
    ui_mcp_proxy: bool
    slot_save_path: Path | None
    cors: tuple[str, ...]
    json: bool
    models: str | None
    models_max: int
    keep_alive: str | None
    sleep_idle_seconds: int | None
    models_preset: str | None
    models_autoload: bool
    default_model: str | None
    subparsers: dict[str, argparse.ArgumentParser]  # each command's parser (cli.main)
    namespace: argparse.Namespace

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(
            model=ns.model, pull=flags.Pull.from_args(ns), host=tuple(ns.host) if ns.host is not None else None, port=ns.port,
            parallel=ns.parallel, api_key=ns.api_key, alias=ns.alias, timeout=ns.timeout, max_queue=ns.max_queue,
            prefill_chunk=ns.prefill_chunk, cache_ram=ns.cache_ram, embeddings=ns.embeddings, pooling=ns.pooling, rerank=ns.rerank,
            load=flags.Load.from_args(ns), lora=flags.Lora.from_args(ns), vision=flags.Vision.from_args(ns),
            sampling=flags.Sampling.from_args(ns), speculate=ns.speculate,
            compact_at=ns.compact_at, template=ns.template, metrics=ns.metrics, slots=ns.slots, spm_infill=ns.spm_infill,
            reasoning_format=ns.reasoning_format, reasoning=ns.reasoning, chat_template_kwargs=ns.chat_template_kwargs,
            mcp_servers_config=ns.mcp_servers_config, mcp_servers_json=ns.mcp_servers_json, slot_save_path=ns.slot_save_path,
            tools=ns.tools, media_path=ns.media_path, tags=ns.tags, verbose_replies=ns.verbose_replies, ui_mcp_proxy=ns.ui_mcp_proxy,
            cors=tuple(ns.cors or ()), json=ns.json, models=ns.models, models_max=ns.models_max, keep_alive=ns.keep_alive,
            sleep_idle_seconds=ns.sleep_idle_seconds, models_preset=ns.models_preset, models_autoload=ns.models_autoload,
            default_model=ns.default_model, subparsers=dict(ns.subparsers or {}), namespace=ns)


def run(args: argparse.Namespace) -> int:
    """The flags as ``ServeOptions`` and a load request; the server is the library's (``localllm.serve.Server``)."""
    # lazy: the load path, the planner, the store and the projector's reader load gguf (~0.1 s), which --help (register above) does not need
    from localllm.commands import vision_cli  # lazy: as in run
    from localllm.plan import fitting  # lazy: as in run
    from localllm.serve import wiring  # lazy: the engine's infill helpers, once serving
    from localllm.serve.server import check_serving, refuse_empty_key  # lazy: the server's module (its scheduler), once serving
    from localllm.store import resolver  # lazy: the store's registry (~20 ms with plan.hardware), which register above does not need

    opts = Options.from_args(args)
    refuse_empty_key(opts.api_key)  # first: an empty key must never reach a server
    hosts = _hosts(list(opts.host) if opts.host is not None else None)
    # a model's or a router's: --parallel past llama.cpp's bound or above --batch, bad --chat-template-kwargs
    check_serving(opts.api_key, opts.parallel, opts.load.batch, opts.reasoning, opts.chat_template_kwargs)
    api_key = opts.api_key or os.environ.get("LOCALLLM_API_KEY") or None
    for host in hosts:
        if not is_loopback(host) and not api_key:
            say(f"warning: listening on {host} without --api-key: anyone who can reach this address can use the model")
    tools = _builtin_tools(opts)
    # a router's model process adds none: the router answers CORS for all of them
    cors = () if os.environ.get(ROUTER_CHILD) == "1" else default_cors(opts.cors, tools, api_key)
    if opts.model is None or opts.models is not None:
        top = ("-v",) * args.verbose + ("--debug",) * args.debug  # localllm's own options, before the command: each child's too
        return _route(opts, api_key, hosts, top, tools, cors)
    if opts.models_preset is not None:
        raise UsageError("--models-preset sets the options of the models serve with no MODEL serves: give it without a MODEL")
    path = model_path(opts.model, opts.pull, opts.load, opts.lora, progress=not opts.json)
    rerank = opts.rerank or opts.pooling == "rank"
    if rerank and opts.vision.mmproj:
        raise UsageError("--mmproj goes with a model that generates, not with --rerank")
    # --mmproj, else a projector beside the model (as run finds it; --no-mmproj: none): checked against the model now,
    # one line naming both files, before anything listens
    mmproj = None if rerank else vision_cli.projector_path(opts.vision, path)
    parallel = opts.parallel
    # --ctx is each sequence's; with none, the plan's default (fitting.for_header): the trained context for each, fitted
    # rows of logits for each sequence's drafts (draftless speculation), none for a model that only embeds or ranks
    draft_rows = None if rerank or opts.speculate == "none" else parallel * (speculation.rows(opts.speculate, serving=True) or 1)
    request = load_request(opts.load, opts.lora, path, opts.load.ctx * parallel if opts.load.ctx else None, n_seq=parallel, serving=True,
                           projector=mmproj, template=opts.template, n_outputs=draft_rows)
    planned = plan_load(opts.load, request).check()  # does not fit (the model, or its projector beside it): one line, before listening
    fitted = planned.lp
    n_ctx_seq = fitted.config.n_ctx // parallel
    if n_ctx_seq < 16:
        raise InputError(f"{parallel} sequences leave {n_ctx_seq} tokens each: lower --parallel or raise --vram")
    if fitted.fit.outcome is not fitting.Outcome.FITS_AS_ASKED or opts.load.vram is not None:
        c = fitted.config
        say(f"fitted to {'--vram ' + fmt.size(opts.load.vram) if opts.load.vram else 'this machine'}: context {c.n_ctx} ({n_ctx_seq} per sequence), "
            f"KV {c.type_k}/{c.type_v}, {fitted.fit.plan.n_gpu_layers} layers on the GPU ({fitted.fit.sentence})")
    sleep_s = None  # serve MODEL sleeps only when asked (the router's 5 minutes are for its models)
    if opts.keep_alive is not None or opts.sleep_idle_seconds is not None:
        from localllm.router import durations  # lazy: the duration parser, only with --keep-alive or --sleep-idle-seconds

        sleep_s = _keep_alive(opts, durations)
    head = wiring.has_rank_head(planned.header) if rerank else True
    if not head:
        say(f"warning: {path.name} {wiring.NO_HEAD}")
    aliases = tuple(a.strip() for a in (opts.alias or "").split(",") if a.strip())
    name = (None if len(aliases) > 1 else opts.alias) or (
        (path.stem if resolver.looks_like_path(opts.model) else opts.model) if not aliases else None)
    mcp_hub = server_tools = None
    from localllm.serve.lifecycle import exec_fresh, inherited_sockets, recover_lost_workers  # lazy: uvicorn (~64 ms), not at import
    from localllm.serve.server import ServeOptions, Server, bind_all  # lazy: the scheduler and the app's state, once serving

    socks = inherited_sockets() or bind_all(hosts, opts.port)  # inherited: this process replaced one that lost its model
    try:
        if opts.mcp_servers_config or opts.mcp_servers_json:
            from localllm.commands.serve_mcp import hub_from_flags  # lazy: localllm.mcp, only with --mcp-servers-*

            mcp_hub = hub_from_flags(opts.mcp_servers_config, opts.mcp_servers_json, say)
        if tools:
            from localllm.server_tools import Toolbox  # lazy: only with --tools

            server_tools = Toolbox(tools)
        options = ServeOptions(
            hosts=tuple(hosts), port=opts.port, api_key=api_key, name=name, aliases=aliases if len(aliases) > 1 else (), tags=_tags(opts.tags),
            max_queue=opts.max_queue, prefill_chunk=opts.prefill_chunk, cache_ram_mib=opts.cache_ram, embeddings_at_start=opts.embeddings,
            pooling=opts.pooling, rerank=opts.rerank, sampling=replace(opts.sampling.config(), speculate=opts.speculate), reasoning=opts.reasoning,
            reasoning_format=opts.reasoning_format, chat_template_kwargs=opts.chat_template_kwargs, spm_infill=opts.spm_infill,
            metrics=opts.metrics, slots=opts.slots, slot_save_path=opts.slot_save_path, compact_at=opts.compact_at, media_path=opts.media_path, cors=cors,
            json_log=opts.json, header_timeout=opts.timeout, mcp=mcp_hub, server_tools=server_tools, verbose=opts.verbose_replies,
            ui_mcp_proxy=opts.ui_mcp_proxy, sleep_idle_s=sleep_s)
        server = Server(planned, options, say=say, socks=socks, rerank_head=head)
        before = (lambda switch: recover_lost_workers(switch, socks, server.abort, opts.load.rpc)) if opts.load.rpc else None
        outcome = server.run(before=before)
    finally:
        for sock in socks:
            sock.close()
        if mcp_hub is not None:
            mcp_hub.close()
        if server_tools is not None:
            server_tools.stop()
    switch = server.switch
    cut = f" ({outcome.aborted} ended early by the stop)" if outcome.aborted else ""
    if switch.handover_fds and not outcome.signalled:
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


def default_cors(given: tuple[str, ...], tools: tuple[str, ...], api_key: str | None) -> tuple[str, ...]:
    """The origins web pages may call from: ``--cors`` as given; else, with the
    built-in tools on, this machine's pages (llama-server's default then); else,
    when an API key is required, any page (llama-server's default: the key, not the
    page's origin, is what lets it in); else none, so a page the user opens cannot
    drive a server that asks no key."""
    if given:
        return given
    if tools:
        return ("localhost",)
    return ("*",) if api_key else ()


def _tags(text: str | None) -> tuple[str, ...]:
    """``--tags a,b``: each once, in order."""
    return tuple(dict.fromkeys(t.strip() for t in (text or "").split(",") if t.strip()))


def _builtin_tools(opts: Options) -> tuple[str, ...]:
    """``--tools``: llama-server's built-in tools (localllm.server_tools), checked before anything listens."""
    if opts.tools is None:
        return ()
    from localllm.server_tools import choose  # lazy: only with --tools

    try:
        return choose(opts.tools)
    except ValueError as exc:
        raise UsageError(f"--tools: {exc}") from None


def _route(opts: Options, api_key: str | None, hosts: list[str], top: tuple[str, ...] = (), tools: tuple[str, ...] = (),
           cors: tuple[str, ...] = ()) -> int:
    """Router mode: serve the models of ``localllm list`` by name (``localllm.router``)."""
    # lazy: the router's catalog, durations and memory plan, for router mode only (its server below loads Starlette, uvicorn and httpx2)
    from localllm.router import catalog, durations, residency
    from localllm.store import registry  # lazy: as in run

    if opts.model is not None:
        raise UsageError(f"--models serves models by name: give --models or a MODEL ({opts.model}), not both")
    if opts.alias is not None:
        raise UsageError("--alias names the one model of serve MODEL: with no MODEL each model is served by its name in localllm list")
    if opts.lora:
        raise UsageError("--lora adapters are for one base model: give serve a MODEL with them")
    if opts.ui_mcp_proxy:  # the router answers no /cors-proxy of its own: refused rather than passed to each model unseen
        raise UsageError("--ui-mcp-proxy goes with serve MODEL: the router has no /cors-proxy")
    if opts.vision.mmproj:
        raise UsageError("--mmproj names one model's projector: give serve a MODEL with it (with no MODEL, each model's own "
                         "projector beside it is found; --no-mmproj turns that off)")
    keep_alive = _keep_alive(opts, durations)
    only = None
    wanted = [n.strip() for n in (opts.models or "all").split(",")]
    if not all(wanted):
        raise UsageError("--models has an empty name: give all, or names from localllm list separated by commas")
    if "all" not in (n.lower() for n in wanted):
        only = tuple(catalog.served_names(wanted, registry.discover()))
    from localllm.router.server import Settings  # lazy: Starlette, uvicorn and httpx2 (~0.1 s), for router mode only
    from localllm.router.server import run as route  # lazy: as above

    per = PerModel(opts.namespace, preset_of(opts.models_preset, opts.subparsers["serve"], serve_flags.refused()), serve_flags.refused())
    per.check()
    if per.preset is not None:  # a section for no model would be options for nothing, silently (issue 64)
        entries = registry.discover()
        stray = [n for n in per.preset.models if registry.find(n, entries) is None]
        if stray:
            raise UsageError(f"{per.preset.path}: [{stray[0]}] names no model of localllm list: name one (localllm list shows them), "
                             "or use [*] for every model")
    autoload = [n for n in (opts.default_model, *(per.preset.on_startup if per.preset else ())) if n]
    autoload = catalog.served_names(autoload, registry.discover()) if autoload else []
    if only is not None:
        only = (*only, *(n for n in autoload if n not in only))  # a model loaded at start is served
    memory = _memory(opts, residency, per)

    def options(name: str) -> tuple[str, ...]:
        """``name``'s child's options: its own layers (``PerModel``), and the GPU budget the router planned it with."""
        out = child_options(per.args(name))
        if memory is not None and memory.budget.gpu is not None and Options.from_args(per.args(name)).load.vram is None:
            out.append(f"--vram={memory.budget.gpu}B")  # each child fits to the budget the router planned it with, not to what its siblings leave
        return tuple(out)

    from localllm.serve.server import bind_all  # lazy: as Settings above

    socks = bind_all(hosts, opts.port)
    mcp_hub = None
    try:
        if opts.mcp_servers_config or opts.mcp_servers_json:  # the router's own: /tools is served by the router, not each model
            from localllm.commands.serve_mcp import hub_from_flags  # lazy: localllm.mcp, only with --mcp-servers-*

            mcp_hub = hub_from_flags(opts.mcp_servers_config, opts.mcp_servers_json, say)
        settings = Settings(only=only, models_max=opts.models_max, keep_alive=keep_alive, max_waiting=opts.max_queue, api_key=api_key,
                            cors=cors, json_log=opts.json, top=top, options=options(""), per_model=options, autoload=tuple(autoload),
                            memory=memory, models_autoload=opts.models_autoload, reload=per.reload, header_timeout=opts.timeout,
                            mcp=mcp_hub, tools=tools)
        return route(socks, settings, say)
    finally:
        for sock in socks:
            sock.close()
        if mcp_hub is not None:
            mcp_hub.close()


def _memory(opts: Options, residency, per):
    """The router's memory plan (``residency.Memory``): each model fitted as
    ``serve MODEL`` fits it (``run``'s rules: the same options, ``--ctx`` per
    sequence, the trained context by default (``fitting.for_header``), ``--parallel``
    sequences), alone, against this machine as it was when the router started:
    the GPU budget (``--vram``, or the device's free memory then, passed on to
    each child as ``--vram``) and the RAM available then, before any model. With
    ``--rpc`` None: the workers' devices are theirs to budget, and each child
    fits to them on its own, as before (``--models-max`` alone decides)."""
    if opts.load.rpc:
        return None
    import psutil  # lazy: router mode only (hardware.detect loads it too)

    from localllm import api  # lazy: the library's planner loads gguf (~0.1 s), router mode only
    from localllm.plan import (
        hardware,  # lazy: as in run
        planner,  # lazy: as above
    )

    hw = hardware.detect(opts.load.vram)
    gpu = hw.gpu_budget
    budget = residency.Budget(gpu=gpu, margin=planner.default_margin(gpu) if gpu is not None else 0, ram=hw.ram_available_bytes)

    def plan(path, name: str = ""):
        mine = Options.from_args(per.args(name))  # the model's own options (its config table, its preset section)
        parallel = mine.parallel
        n_ctx = mine.load.ctx * parallel if mine.load.ctx else None  # None: the plan's default, as serve MODEL asks (run above)
        request = fit_request(mine.load, mine.lora, n_ctx)
        lp = api.prepare(path, request, hw=hw, n_ctx=n_ctx, n_seq=parallel, dry_run=not mine.load.no_dry_run, serving=True)
        if lp.refits:
            say(f"{path.name}: llama.cpp's dry run needs a larger compute buffer than estimated: refitted ({lp.fit.sentence})")
        return lp

    return residency.Memory(budget=budget, plan=plan, ram_now=lambda: psutil.virtual_memory().available)


def _keep_alive(opts: Options, durations) -> float | None:
    """How long an idle model stays loaded: --keep-alive (Ollama's), --sleep-idle-seconds
    (llama-server's), OLLAMA_KEEP_ALIVE, else Ollama's 5 minutes; None: for ever."""
    typed, idle = opts.keep_alive, opts.sleep_idle_seconds
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
                         "sleep_idle_seconds", "cors", "help", "mcp_servers_config", "mcp_servers_json", "tools"})


def child_options(args: argparse.Namespace) -> list[str]:
    """The serve options given (typed or from the config file) that apply to each
    model, as a child's command line: each option that differs from its default,
    as ``--flag=value`` (a negative value cannot pass for a flag)."""
    parser = (args.subparsers or {}).get("serve")
    if parser is None:
        raise UsageError("serve with no MODEL runs from the command line (localllm serve), which knows its options")
    out: list[str] = []
    by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:  # noqa: SLF001 - argparse has no public list of a parser's options
        if action.option_strings and action.help != argparse.SUPPRESS and action.dest not in ROUTER_ONLY:
            by_dest.setdefault(action.dest, []).append(action)
    for dest, actions in by_dest.items():
        value = getattr(args, dest, None)  # reflective: each option of serve's parser by its destination, whichever command set it
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


def _hosts(given: list[str] | None) -> list[str]:
    """``--host`` repeated or comma-separated, as llama-server's list; each once."""
    hosts = [h.strip() for value in (given or ["127.0.0.1"]) for h in value.split(",")]
    if not all(hosts):
        raise UsageError("--host has an empty address")
    return list(dict.fromkeys(hosts))
