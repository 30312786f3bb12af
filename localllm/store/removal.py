"""``localllm rm`` as a library: delete a model localllm stored; for anyone
else's, say whose. The CLI (``localllm rm``) and the router's ``/api/delete``
both call it.

localllm stored: files it pulled (in the Hugging Face cache: the snapshot link
and, when nothing else links to it, the blob), GGUFs in its own models folder,
and the paths ``add`` remembered (only the memory goes, never the file). Files
of the Hugging Face cache that other tools downloaded, LM Studio's, Ollama's
and the pip-shipped default model are not touched: ``refusal`` names the tool's
own way to remove them.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm import paths
from localllm.store import builtin, hf_cache, registry

NOT_OURS = {
    "embedded": "ships in a pip package; remove it with pip uninstall {pkg}",
    "hf-cache": "is in the Hugging Face cache but localllm did not download it; remove it with: hf cache rm model/{repo}",
    "lmstudio": "belongs to LM Studio; delete it in LM Studio's My Models",
    "ollama": "belongs to Ollama; remove it with: ollama rm {name}",
}


@dataclass(frozen=True)
class Removed:
    action: str  # "delete", or "forget" for an added path (the file stays)
    deleted: list[str]  # the paths deleted


def assembled(entry: registry.ModelEntry) -> bool:
    """gemma3-270m is assembled by localllm into its own folder: that copy is ours."""
    return entry.source == "embedded" and entry.path.parent == paths.models_dir() and entry.path.exists()


def refusal(entry: registry.ModelEntry) -> str | None:
    """Why localllm will not delete ``entry`` (whose it is, and how its owner removes
    it), or None when localllm stored it."""
    if entry.source not in NOT_OURS or assembled(entry):
        return None
    found = builtin.find_entry(entry.name)
    pkg = found.package if found else entry.name
    msg = NOT_OURS[entry.source].format(pkg=pkg, repo=entry.repo, name=entry.name)
    return f"{entry.name} {msg}; localllm deletes only what it stored"


def action(entry: registry.ModelEntry) -> str:
    return "forget" if entry.source == "added" else "delete"


def remove(entry: registry.ModelEntry) -> Removed:
    """Delete (or, for an added path, forget) ``entry``, which ``refusal`` passed."""
    deleted: list[str] = []
    if entry.source == "pulled":
        cached = hf_cache.lookup(paths.hf_hub_cache(), entry.repo or "", entry.filename or "", entry.commit or "main")
        if cached is not None:
            deleted = [str(p) for p in hf_cache.remove(paths.hf_hub_cache(), cached)]
        registry.forget_pull(entry.repo or "", entry.filename or "")
    elif entry.source == "added":
        if str(entry.path) in registry.load_record().added:
            registry.forget_added(entry.path)  # added as a file: forget it
        else:
            registry.hide_added(entry.path)  # one file of an added folder: its siblings stay
    else:  # localllm's own folder, or the assembled gemma3-270m
        entry.path.unlink()
        deleted = [str(entry.path)]
    return Removed(action(entry), deleted)
