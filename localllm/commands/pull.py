"""``localllm pull REPO[:QUANT]``: one GGUF from the Hub into the Hugging Face cache.

The names, the default choice and the transfer are ``store.pulling``'s and
``store.hub``'s (the router's ``/api/pull`` calls the same); this adds the
flags, the GPU-budget pick and what is printed.

Which file: ``--file`` names it; ``--quant`` (or ``REPO:QUANT``) picks by quant;
``--vram`` (or a detected GPU) picks the largest quant the planner fits with every
layer on the GPU; otherwise Q4_K_M, the common default (Ollama's too), or the
repo's only GGUF.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from localllm import api, paths
from localllm.commands._common import say
from localllm.engine_api import LoadConfig
from localllm.errors import InputError, UsageError
from localllm.modelfile.stub import header_stub
from localllm.plan import fitting, hardware, verdict
from localllm.plan.prepare import DRY_RUN
from localllm.store import hf_cache, hub, pulling
from localllm.util import fmt


def run(args: argparse.Namespace) -> int:
    repo_id, tag = pulling.target(args.repo)
    if tag and (args.quant or args.file):
        raise UsageError("give the quant once: REPO:QUANT, or --quant, or --file")
    quant = args.quant or tag
    revision = hf_cache.check_revision(args.revision)
    if args.file:
        hf_cache.check_filename(args.file)
    off = hub.offline(args.offline)
    filename, reason = _choose(args, repo_id, revision, quant, off)
    if args.file:
        pulling.single(hub.RemoteFile(args.file, 0, None), repo_id)
    result = hub.pull_all(repo_id, filename, revision, progress=not args.json, reason=reason, offline_mode=off)
    if args.json:
        fmt.print_json(result.to_dict())
        return 0
    if result.from_cache:
        off_note = " (offline)" if off else ""
        say(f"{filename} is in the cache already ({fmt.size(result.size)}): nothing downloaded{off_note}")
    else:
        kept = f", resumed after {fmt.size(result.resumed_from)} kept from before" if result.resumed_from else ""
        say(f"downloaded {fmt.size(result.downloaded_bytes)}{kept}; sha256 verified")
    print(f"{fmt.safe(result.name)}\t{fmt.safe(result.path)}")
    say(f"{reason}; run it with: localllm run {result.name}")
    return 0


def _choose(args: argparse.Namespace, repo_id: str, revision: str, quant: str | None, off: bool) -> tuple[str, str]:
    if args.file:
        return args.file, "the file asked for"
    files = hub.cached_ggufs(repo_id, revision) if off else hub.list_ggufs(repo_id, revision)
    if not files:
        where = "cached (offline)" if off else "in the repo"
        raise InputError(f"no GGUF files of {repo_id} {where}" + ("; run without --offline to look on the Hub" if off else ""))
    if quant:
        return pulling.by_quant(files, quant, repo_id, offline_mode=off)
    budget = args.vram
    if budget is None:

        hw = hardware.detect(None)
        budget = hw.gpu_budget
    if budget is not None:
        import psutil

        hw = hardware.Hardware("GPU", budget, None, "--vram", psutil.virtual_memory().total, psutil.virtual_memory().available)
        f, why = hub.pick_by_budget(files, lambda rf: _judge(repo_id, revision, rf, off, hw, not args.no_dry_run), budget)
        return pulling.single(f, repo_id), why
    return pulling.by_default(files, repo_id)


def _judge(repo_id: str, revision: str, f: hub.RemoteFile, off: bool, hw: hardware.Hardware, dry_run: bool):
    """The verdict on one file for the budget ``hw``, as ``run`` would fit it:
    from the cached file, or (not downloaded) from its header read with HTTP
    ranges and written into a sparse stub, so llama.cpp's dry run referees the
    compute figure either way (``plan.prepare``)."""
    request = fitting.Request(LoadConfig())
    if off:

        found = hf_cache.lookup(paths.hf_hub_cache(), repo_id, f.filename, revision)
        if found is None:
            raise InputError(f"{repo_id}/{f.filename} is not cached")
        lp = api.prepare(found.path, request, hw=hw, dry_run=dry_run)
    else:
        _, prefix = hub.remote_prefix(repo_id, revision, f)
        with header_stub(prefix, f.size) as stub:
            lp = api.prepare(stub, request, hw=hw, dry_run=dry_run)
    v = verdict.of_fit(lp.fit, lp.total)
    if lp.compute_source == DRY_RUN:  # said in the reason the pick prints
        v = replace(v, text=f"{v.text}, compute from llama.cpp's dry run of its header")
    return v
