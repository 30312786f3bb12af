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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from localllm import flags, paths
from localllm.commands._common import say
from localllm.errors import InputError, UsageError
from localllm.util import fmt
from localllm.util.units import Size

if TYPE_CHECKING:
    from localllm.flags import Subparsers
    from localllm.plan import hardware
    from localllm.store import hub


def register(sub: Subparsers) -> None:
    p = sub.add_parser("pull", help="download a GGUF from Hugging Face into its cache (resumable, checksum verified)")
    p.add_argument("repo", metavar="REPO[:QUANT]",
        help="owner/name on the Hub, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M, or a catalog name (list --catalog)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--file", default=None, metavar="NAME", help="the file in the repo")
    which.add_argument("--quant", default=None, metavar="Q", help="the quant to take, e.g. Q4_K_M or Q8_0")
    p.add_argument("--vram", type=flags.size, default=None, metavar="SIZE",
        help="with no --file/--quant: the largest quant that fits this GPU budget, by the planner")
    p.add_argument("--revision", default="main", metavar="REV", help="branch, tag or commit (default: main)")
    p.add_argument("--offline", action="store_true", help="use the cache only; never touch the network (also: HF_HUB_OFFLINE=1)")
    p.add_argument("--no-dry-run", action="store_true",
        help="with --vram: judge each quant by the rules alone, without llama.cpp's dry run of its header")
    p.add_argument("--json", action="store_true", help="one JSON object")


@dataclass(frozen=True)
class Options:
    repo: str
    file: str | None
    quant: str | None
    vram: Size | None
    revision: str
    offline: bool
    no_dry_run: bool
    json: bool

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Options:
        return cls(repo=ns.repo, file=ns.file, quant=ns.quant, vram=ns.vram, revision=ns.revision, offline=ns.offline,
                   no_dry_run=ns.no_dry_run, json=ns.json)


def run(args: argparse.Namespace) -> int:
    # lazy: the resolver loads gguf (~0.1 s), the Hub's client and the cache's names ~15 ms: --help (register above) needs none
    from localllm.store import hf_cache, hub, pulling

    opts = Options.from_args(args)
    repo_id, tag = pulling.target(opts.repo)
    if tag and (opts.quant or opts.file):
        raise UsageError("give the quant once: REPO:QUANT, or --quant, or --file")
    quant = opts.quant or tag
    revision = hf_cache.check_revision(opts.revision)
    if opts.file:
        hf_cache.check_filename(opts.file)
    off = hub.offline(opts.offline)
    filename, reason = _choose(opts, repo_id, revision, quant, off)
    if opts.file:
        pulling.single(hub.RemoteFile(opts.file, 0, None), repo_id)
    result = hub.pull_all(repo_id, filename, revision, progress=not opts.json, reason=reason, offline_mode=off)
    if opts.json:
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


def _choose(opts: Options, repo_id: str, revision: str, quant: str | None, off: bool) -> tuple[str, str]:
    if opts.file:
        return opts.file, "the file asked for"
    from localllm.plan import hardware  # lazy: reads the GPU and RAM (~3 ms at import), only to pick a quant
    from localllm.store import hub, pulling  # lazy: as in run

    files = hub.cached_ggufs(repo_id, revision) if off else hub.list_ggufs(repo_id, revision)
    if not files:
        where = "cached (offline)" if off else "in the repo"
        raise InputError(f"no GGUF files of {repo_id} {where}" + ("; run without --offline to look on the Hub" if off else ""))
    if quant:
        return pulling.by_quant(files, quant, repo_id, offline_mode=off)
    budget: int | None = opts.vram
    if budget is None:

        hw = hardware.detect(None)
        budget = hw.gpu_budget
    if budget is not None:
        import psutil

        hw = hardware.Hardware("GPU", budget, None, "--vram", psutil.virtual_memory().total, psutil.virtual_memory().available)
        f, why = hub.pick_by_budget(files, lambda rf: _judge(repo_id, revision, rf, off, hw, not opts.no_dry_run), budget)
        return pulling.single(f, repo_id), why
    return pulling.by_default(files, repo_id)


def _judge(repo_id: str, revision: str, f: hub.RemoteFile, off: bool, hw: hardware.Hardware, dry_run: bool):
    """The verdict on one file for the budget ``hw``, as ``run`` would fit it:
    from the cached file, or (not downloaded) from its header read with HTTP
    ranges and written into a sparse stub, so llama.cpp's dry run referees the
    compute figure either way (``plan.prepare``)."""
    from localllm import api  # lazy: the library's planner loads gguf (~0.1 s), which --help does not need
    from localllm.engine_api import LoadConfig  # lazy: as above
    from localllm.modelfile.stub import header_stub  # lazy: as above
    from localllm.plan import fitting, verdict  # lazy: as above
    from localllm.plan.prepare import DRY_RUN  # lazy: as above
    from localllm.store import hf_cache, hub  # lazy: as in run

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
