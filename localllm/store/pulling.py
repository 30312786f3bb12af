"""``localllm pull`` as a library: the names it takes, the file it chooses, and
the pull itself with a progress callback. The CLI (``localllm pull``) and the
router's ``/api/pull`` both call it, so both resume, check the sha256 and
distrust the Hub's answers the same way (``hub.pull``).

- ``target``: a catalog name (``llama-3.2-1b-instruct[:q8_0]``),
  ``owner/repo[:QUANT]``, ``hf.co/owner/repo[:QUANT]`` or a Hub URL, as
  (repo, quant asked or None);
- ``by_quant``, ``by_default``: the file a quant names; the default file
  (Q4_K_M, Ollama's common default, or the repo's only GGUF). The CLI puts its
  GPU-budget pick between the two;
- ``pull``: a name to a stored file, without a terminal and without a budget
  pick (as Ollama's pull: the file a name stands for does not depend on the
  machine), each step given to ``on_progress`` (``hub.Progress``);
- ``ollama_alias``: an Ollama library name (``llama3.2:1b``) as the catalog's
  name for the same model, where the catalog has it.
"""

from __future__ import annotations

from localllm.errors import InputError
from localllm.store import curated, hf_cache, hub, names
from localllm.store.modelname import quant_of, split_part

HUB_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/")
REVISION = names.REVISION


def parse_repo(text: str) -> tuple[str, str | None]:
    """``owner/name``, ``owner/name:Q4_K_M``, ``hf.co/owner/name``, or a Hub URL."""
    for prefix in HUB_PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
    text = text.rstrip("/")
    repo, _, tag = text.partition(":")
    return hf_cache.check_repo_id(repo), (tag or None)


def target(text: str) -> tuple[str, str | None]:
    """(repo, quant asked) of a name ``pull`` takes: a catalog name gives its repo
    (and its quant when the name says one), anything else is read as a repo."""
    named = names.parse(text)
    if named is not None and named.filename is not None:  # a catalog name: its repo and quant
        return named.repo_id, (named.quant if ":" in text else None)
    return parse_repo(text)


def single(f: hub.RemoteFile, repo_id: str) -> str:
    """The file to name: a single one, or the first part of a split model (all its parts are pulled)."""
    part = split_part(f.filename)
    if part is not None and part[0] != 1:
        raise InputError(f"{f.filename} is part {part[0]} of {part[1]}: name the first part (…-00001-of-{part[1]:05d}.gguf); "
                         "every part is pulled")
    return f.filename


def by_quant(files: list[hub.RemoteFile], quant: str, repo_id: str, offline_mode: bool = False) -> tuple[str, str]:
    """(file, why) for the quant asked."""
    f = hub.pick_by_quant(files, quant, repo_id, offline_mode=offline_mode)
    return single(f, repo_id), f"{f.quant}, as asked"


def by_default(files: list[hub.RemoteFile], repo_id: str, *, cli: bool = True) -> tuple[str, str]:
    """(file, why) when no quant is asked: Q4_K_M, else the repo's only GGUF; else an
    error listing the quants (``cli``: naming pull's flags, else the ``REPO:QUANT`` form)."""
    q4 = [f for f in files if f.quant == "Q4_K_M"]
    if q4:
        return single(q4[0], repo_id), "Q4_K_M, the default (no GPU budget to fit; --quant or --vram to choose)"
    if len(files) == 1:
        return single(files[0], repo_id), "the repo's only GGUF"
    quants = ", ".join(sorted({f.quant or f.filename for f in files}))
    how = f"choose with --quant ({quants}) or --vram SIZE" if cli else f"name one as {repo_id}:QUANT ({quants})"
    raise InputError(f"{repo_id} has {len(files)} GGUFs and no Q4_K_M: {how}")


def pull(text: str, *, revision: str = REVISION, on_progress: hub.OnProgress | None = None, progress: bool = False) -> hub.PullResult:
    """The model ``text`` names (``target``) into the cache: the quant asked, else the
    default file (``by_default``); offline (``HF_HUB_OFFLINE``), from the cache only.
    Blocking: the router runs it in a thread of its own."""
    repo_id, quant = target(text)
    revision = hf_cache.check_revision(revision)
    off = hub.offline(False)
    files = hub.cached_ggufs(repo_id, revision) if off else hub.list_ggufs(repo_id, revision)
    if not files:
        raise InputError(f"no GGUF files of {repo_id} {'cached (offline)' if off else 'in the repo'}")
    filename, reason = by_quant(files, quant, repo_id, offline_mode=off) if quant else by_default(files, repo_id, cli=False)
    return hub.pull_all(repo_id, filename, revision, progress=progress, reason=reason, offline_mode=off, on_progress=on_progress)


# -- Ollama's names --------------------------------------------------------------------

# Ollama's library names of the catalog's models: model -> {size tag: catalog name};
# "" is the model's ``latest`` where Ollama's latest is that size (gemma2's and
# gemma3's are sizes the catalog lacks; smollm2's would shadow the built-in smollm2).
OLLAMA: dict[str, dict[str, str]] = {
    "llama3.2": {"1b": "llama-3.2-1b-instruct", "3b": "llama-3.2-3b-instruct", "": "llama-3.2-3b-instruct"},
    "llama3.1": {"8b": "llama-3.1-8b-instruct", "": "llama-3.1-8b-instruct"},
    "qwen2.5": {"0.5b": "qwen2.5-0.5b-instruct", "1.5b": "qwen2.5-1.5b-instruct", "3b": "qwen2.5-3b-instruct",
                "7b": "qwen2.5-7b-instruct", "": "qwen2.5-7b-instruct"},
    "phi3.5": {"3.8b": "phi-3.5-mini-instruct", "": "phi-3.5-mini-instruct"},
    "gemma2": {"2b": "gemma-2-2b-it"},
    "gemma3": {"1b": "gemma-3-1b-it"},
    "smollm2": {"1.7b": "smollm2-1.7b-instruct"},
    "mistral": {"7b": "mistral-7b-instruct-v0.3", "": "mistral-7b-instruct-v0.3"},
    "qwen3": {"30b-a3b": "qwen3-30b-a3b", "30b": "qwen3-30b-a3b"},
    "gpt-oss": {"20b": "gpt-oss-20b", "": "gpt-oss-20b"},
    "granite3.1-moe": {"3b": "granite-3.1-3b-a800m-instruct", "": "granite-3.1-3b-a800m-instruct"},
}
_OLLAMA_HOSTS = ("registry.ollama.ai/library/", "ollama.com/library/", "library/")


def ollama_names() -> list[str]:
    """The Ollama names ``ollama_alias`` knows, for a message."""
    return [f"{m}:{size}" for m, sizes in OLLAMA.items() for size in sizes if size]


def ollama_alias(name: str) -> str | None:
    """The catalog name (with its quant) for an Ollama library name: ``llama3.2:1b``
    is ``llama-3.2-1b-instruct:q4_k_m``, ``llama3.2:1b-instruct-q8_0`` its Q8_0;
    None for a name the catalog has no model for (a base ``-text`` model included).
    The quant is the tag's, else the catalog's default (Q4_K_M, or its only one)."""
    text = name.strip().lower()
    for host in _OLLAMA_HOSTS:
        text = text.removeprefix(host)
    model, _, tag = text.partition(":")
    sizes = OLLAMA.get(model)
    if sizes is None:
        return None
    tag = "" if tag == "latest" else tag
    for size in sorted(sizes, key=len, reverse=True):  # 30b-a3b before 30b
        if (size and (tag == size or tag.startswith(size + "-"))) or (not size and not tag):
            rest = tag[len(size):].strip("-")
            if "text" in rest.split("-"):
                return None  # Ollama's base models: the catalog has the instruct ones
            return _with_quant(sizes[size], quant_of(rest) if rest else None)
    return None


def _with_quant(catalog_name: str, quant: str | None) -> str:
    for m in curated.load():
        if m.name == catalog_name:
            have = [f.quant for f in m.files]
            q = quant or (names.DEFAULT_QUANT if names.DEFAULT_QUANT in have else have[0])
            return f"{catalog_name}:{q.lower()}"
    return catalog_name
