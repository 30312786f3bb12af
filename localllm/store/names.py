"""Names of models on the Hub: the catalog's (``llama-3.2-1b-instruct:q8_0``) and
``owner/repo[:QUANT]`` (also ``hf.co/owner/repo``), whether downloaded or not.

``resolver.resolve`` asks here last, for a name that is not a file, a built-in
or a registered model: a name whose file is in the Hugging Face cache resolves
to it; one that is not downloaded is an ``InputError`` saying how to get it.
``plan`` and ``inspect`` go further: ``header_of`` reads the header over HTTP
ranges into a sparse stub (``modelfile.stub``), nothing stored, so a model can
be planned, by llama.cpp's dry run too, before it is downloaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from localllm import paths
from localllm.errors import InputError, UsageError
from localllm.modelfile.stub import header_stub, header_stubs
from localllm.store import curated, hf_cache, hub

DEFAULT_QUANT = "Q4_K_M"  # Ollama's and bartowski's common default, and pull's
REVISION = "main"
_HUB_PREFIXES = ("https://huggingface.co/", "http://huggingface.co/", "huggingface.co/", "hf.co/")


@dataclass(frozen=True)
class HubName:
    """A model on the Hub: its repo, the quant asked (None: the default), and
    the file when the catalog names it."""

    typed: str
    repo_id: str
    quant: str | None
    filename: str | None = None

    @property
    def pull_arg(self) -> str:
        """What to give ``localllm pull``."""
        return f"{self.repo_id}:{self.quant}" if self.quant else self.repo_id


class NotDownloaded(InputError):
    """A Hub name whose file is not in the cache."""

    def __init__(self, name: HubName) -> None:
        self.name = name
        what = "" if name.filename is not None else "no such file here, and the Hub model "
        super().__init__(f"{what}{name.typed} is not downloaded: localllm pull {name.pull_arg} gets it "
                         f"(localllm plan {name.typed} reads its header first, without downloading)")


def parse(text: str) -> HubName | None:
    """The Hub model ``text`` names, or None when it names none. A catalog name
    takes the catalog's file for the quant (Q4_K_M unless ``:QUANT``); a quant
    the catalog does not list is refused with the ones it does."""
    base, _, tag = text.partition(":")
    quant = tag.upper() or None
    for m in curated.load():
        if m.name == base.lower():
            q = quant or DEFAULT_QUANT
            files = {f.quant: f for f in m.files}
            if q not in files:
                raise InputError(f"{m.name} has no {q} in the catalog (it has: {', '.join(files)}); "
                                 f"localllm pull {m.repo}:{q} looks for it on the Hub")
            return HubName(text, m.repo, q, files[q].file)
    for prefix in _HUB_PREFIXES:
        if base.startswith(prefix):
            base = base[len(prefix):].rstrip("/")
    if base.count("/") != 1 or base.lower().endswith(".gguf") or base.startswith((".", "/", "~")):
        return None
    try:
        repo = hf_cache.check_repo_id(base)
    except UsageError:
        return None
    return HubName(text, repo, quant)


def _pick(name: HubName, files: list[hub.RemoteFile]) -> hub.RemoteFile:
    """The file ``name`` stands for among ``files``: the catalog's, the quant
    asked, or the default quant (or the repo's only GGUF)."""
    if name.filename is not None:
        hits = [f for f in files if f.filename == name.filename]
        if hits:
            return hits[0]
    if name.quant:
        return hub.pick_by_quant(files, name.quant, name.repo_id)
    defaults = [f for f in files if f.quant == DEFAULT_QUANT]
    if defaults or len(files) == 1:
        return (defaults or files)[0]
    quants = ", ".join(sorted({f.quant or f.filename for f in files}))
    raise InputError(f"{name.repo_id} has {len(files)} GGUFs and no {DEFAULT_QUANT}: name one, e.g. {name.repo_id}:{quants.split(', ')[0]} "
                     f"(it has: {quants})")


def cached(name: HubName) -> Path | None:
    """The cached file ``name`` stands for, or None."""
    files = hub.cached_ggufs(name.repo_id, REVISION)
    if not files:
        return None
    try:
        f = _pick(name, files)
    except InputError:
        return None
    found = hf_cache.lookup(paths.hf_hub_cache(), name.repo_id, f.filename, REVISION)
    return found.path if found is not None else None


@dataclass(frozen=True)
class Remote:
    """A model read from the Hub without downloading it."""

    name: HubName
    file: hub.RemoteFile
    header_bytes: int = 0  # the bytes read to get the header (its prefix up to the tensor data)

    @property
    def label(self) -> str:
        return f"{self.name.repo_id}/{self.file.filename}"


@contextmanager
def header_of(name: HubName) -> Iterator[tuple[Path, Remote]]:
    """The model's header read with HTTP ranges (a few MiB, nothing stored)
    into a sparse stub of its full size, removed on exit: (stub path, what was read)."""
    if hub.offline(False):
        raise InputError(f"{name.typed} is not downloaded, and the Hub is off (HF_HUB_OFFLINE): localllm pull {name.pull_arg} when online")
    files = hub.list_ggufs(name.repo_id, REVISION)
    if not files:
        raise InputError(f"no GGUF files in {name.repo_id}")
    f = _pick(name, files)
    with remote_stub(name.repo_id, REVISION, f, files) as (stub, read):
        yield stub, Remote(name, f, read)


@contextmanager
def remote_stub(repo_id: str, revision: str, f: hub.RemoteFile, files: list[hub.RemoteFile]) -> Iterator[tuple[Path, int]]:
    """A remote model's sparse stand-in (``modelfile.stub``): one file, or every
    part of a split model under its own name; (the first file's path, the bytes read)."""
    parts = hub.parts_of(f, files, repo_id)
    if len(parts) == 1:
        _, prefix = hub.remote_prefix(repo_id, revision, f)
        with header_stub(prefix, f.size) as stub:
            yield stub, len(prefix)
        return
    read = [(p.filename.rsplit("/", 1)[-1], hub.remote_prefix(repo_id, revision, p)[1], p.size) for p in parts]
    with header_stubs(read) as stub:
        yield stub, sum(len(prefix) for _, prefix, _ in read)
