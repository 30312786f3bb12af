"""The Hugging Face hub cache, read and written in the layout huggingface_hub uses.

::

    <cache>/models--<owner>--<name>/
        blobs/<etag>                       the bytes, named by their sha256 (LFS) or git sha1
        snapshots/<commit>/<file>          a relative symlink to ../../blobs/<etag>
        refs/<revision>                    the commit a branch pointed to

A file pulled by localllm is stored once, there, so ``huggingface_hub``,
``llama.cpp -hf`` and other tools see it too (and we see theirs). Pure Python: no
huggingface_hub import, so listing models stays fast and works without it.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from localllm.errors import InputError, UsageError
from localllm.util import atomic

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# C0 and C1 control characters and DEL: a name carrying them could move the
# cursor or forge a line on the user's terminal when printed.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_MAX_NAME = 1024


def check_repo_id(repo_id: str) -> str:
    """Refuse repo ids that are not ``owner/name`` (or a bare ``name``) made of
    the characters the Hub allows: no ``..``, no absolute paths, no backslashes."""
    parts = repo_id.split("/")
    ok = (
        0 < len(parts) <= 2
        and len(repo_id) <= 96
        and all(_PART.fullmatch(p) for p in parts)
        and ".." not in repo_id
        and "--" not in repo_id
        and not any(p.endswith(".") for p in parts)
    )
    if not ok:
        raise UsageError(f"'{repo_id}' is not a Hugging Face repo id: use owner/name, e.g. bartowski/Llama-3.2-1B-Instruct-GGUF")
    return repo_id


def unsafe_filename(filename: str) -> str | None:
    """Why ``filename`` cannot be a path inside a repo's snapshot folder, or None.

    File names come from the user (``--file``) and from the server (its listing);
    both are checked the same way: no absolute paths, ``..`` or empty parts,
    backslashes, ``~`` or control characters."""
    if not filename or len(filename) > _MAX_NAME:
        return "empty or too long"
    if _CONTROL.search(filename):
        return "control characters"
    if "\\" in filename or filename.startswith("~") or PurePosixPath(filename).is_absolute():
        return "an absolute path or a backslash"
    if any(part in ("", ".", "..") for part in filename.split("/")):
        return "'..' or empty parts"
    return None


def check_filename(filename: str) -> str:
    """A file name the user gave: refused (usage error) when it would escape the
    snapshot folder."""
    if unsafe_filename(filename) is not None:
        raise UsageError(f"{safe(filename)} is not a file name inside a repo (no absolute paths, '..' or control characters)")
    return filename


def check_remote_filename(filename: str) -> str:
    """A file name the server sent: refused (input error, exit 1) when unsafe."""
    why = unsafe_filename(filename)
    if why is not None:
        raise InputError(f"the server sent an unsafe file name {safe(filename)} ({why}); nothing was written")
    return filename


def check_commit(commit: str) -> str:
    """A commit id the server sent must be 40 hex digits: it becomes a folder name."""
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
        raise InputError(f"the server sent an invalid commit id {safe(str(commit))}: expected 40 hex digits; nothing was written")
    return commit


def safe(text: str, limit: int = 400) -> str:
    """``text`` quoted for a terminal: control characters escaped, length bounded."""
    shown = text if len(text) <= limit else text[:limit] + "…"
    return "'" + _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", shown) + "'"


def inside(root: Path, path: Path) -> bool:
    """Whether ``path`` (symlinks along it resolved) lies inside ``root``."""
    try:
        return path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):
        return False


def _require_inside(root: Path, path: Path) -> Path:
    if not inside(root, path):
        raise InputError(f"refusing to write {safe(str(path))}: it resolves outside {root}")
    return path


def check_revision(revision: str) -> str:
    if (
        not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", revision)
        or ".." in revision
        or "//" in revision
        or revision.endswith("/")
        or len(revision) > 200
    ):
        raise UsageError(f"{safe(revision)} is not a branch, tag or commit")
    return revision


def repo_folder(cache: Path, repo_id: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--"))


def repo_id_of(folder_name: str) -> str | None:
    if not folder_name.startswith("models--"):
        return None
    return folder_name[len("models--") :].replace("--", "/")


@dataclass(frozen=True)
class CachedFile:
    repo_id: str
    filename: str  # path inside the repo
    commit: str
    path: Path  # the snapshot path (a symlink into blobs/)
    blob: Path  # what it points at
    size: int


def commit_for(cache: Path, repo_id: str, revision: str) -> str | None:
    """The commit ``revision`` names in the cache (a branch's ref, or a commit itself)."""
    if _COMMIT.fullmatch(revision):
        return revision
    ref = repo_folder(cache, repo_id) / "refs" / revision
    try:
        commit = ref.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return commit if _COMMIT.fullmatch(commit) else None


def lookup(cache: Path, repo_id: str, filename: str, revision: str = "main") -> CachedFile | None:
    """The cached file for (repo, file, revision), or None: what offline mode can use."""
    commit = commit_for(cache, repo_id, revision)
    if commit is None:
        return None
    path = repo_folder(cache, repo_id) / "snapshots" / commit / filename
    return _cached(repo_id, filename, commit, path)


def _cached(repo_id: str, filename: str, commit: str, path: Path) -> CachedFile | None:
    try:
        blob = path.resolve(strict=True)
        size = blob.stat().st_size
    except (OSError, RuntimeError):
        return None
    return CachedFile(repo_id, filename, commit, path, blob, size)


def scan(cache: Path, repo_id: str | None = None) -> list[CachedFile]:
    """Every GGUF in the cache (or in one repo), one per (repo, file): the copy at
    ``refs/main``'s commit when there is one, else the newest snapshot's. Broken
    links are skipped."""
    out: list[CachedFile] = []
    try:
        repos = [repo_folder(cache, repo_id)] if repo_id else sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        return out
    for folder in repos:
        rid = repo_id_of(folder.name)
        snaps = folder / "snapshots"
        if rid is None or not snaps.is_dir():
            continue
        main = commit_for(cache, rid, "main")
        try:
            commits = sorted(snaps.iterdir(), key=lambda p: (p.name == main, _mtime(p)), reverse=True)
        except OSError:
            continue
        seen: set[str] = set()
        for snap in commits:
            for path in sorted(snap.rglob("*.gguf")):
                filename = path.relative_to(snap).as_posix()
                if filename in seen:
                    continue
                found = _cached(rid, filename, snap.name, path)
                if found is not None:
                    seen.add(filename)
                    out.append(found)
    return out


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except OSError:
        return 0.0


def blob_path(cache: Path, repo_id: str, etag: str) -> Path:
    if not isinstance(etag, str) or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", etag):
        raise InputError(f"the server gave an unusable checksum {safe(str(etag))}; nothing was written")
    folder = repo_folder(cache, repo_id)
    return _require_inside(folder, folder / "blobs" / etag)


def hasher(etag: str, size: int) -> hashlib._Hash:
    """A hash object for checking bytes against an etag: LFS files are named by
    their sha256; small files kept in git by their git blob sha1
    (``sha1("blob <size>\\0" + data)``)."""
    if _SHA256.fullmatch(etag):
        return hashlib.sha256()
    h = hashlib.sha1()
    h.update(f"blob {size}\0".encode())
    return h


def hash_file(path: Path, etag: str, size: int | None = None, chunk: int = 1 << 20) -> hashlib._Hash:
    """The file's bytes in a hasher; ``size`` is the full file's, when this is its first part."""
    h = hasher(etag, path.stat().st_size if size is None else size)
    with path.open("rb") as f:
        while data := f.read(chunk):
            h.update(data)
    return h


def snapshot_path(cache: Path, repo_id: str, commit: str, filename: str) -> Path:
    """``snapshots/<commit>/<filename>``, checked: the commit and name as the
    server may send them, and the folder resolving inside the repo's (a link
    planted in the cache cannot send the write elsewhere). Called before the
    download starts, and again before the link is made."""
    check_repo_id(repo_id)
    check_commit(commit)
    check_remote_filename(filename)
    folder = repo_folder(cache, repo_id)
    dest = folder / "snapshots" / commit / filename
    _require_inside(folder / "snapshots", dest.parent)
    return dest


def link(cache: Path, repo_id: str, revision: str, commit: str, filename: str, blob: Path) -> Path:
    """Point ``snapshots/<commit>/<filename>`` at the blob (relative symlink) and
    record ``refs/<revision>``, as huggingface_hub does. Where symlinks are not
    allowed the blob moves into the snapshot (huggingface_hub's own fallback).

    The commit and file name come from the server: both are checked, and every
    path is checked to resolve inside the repo's folder (a symlink planted in
    the cache cannot redirect the write) before anything is created."""
    folder = repo_folder(cache, repo_id)
    _require_inside(folder / "blobs", blob)
    dest = snapshot_path(cache, repo_id, commit, filename)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _require_inside(folder / "snapshots", dest.parent)
    if dest.is_symlink() or dest.exists():
        dest.unlink()
    try:
        os.symlink(os.path.relpath(blob, dest.parent), dest)
    except OSError:
        os.replace(blob, dest)
    if revision != commit:
        check_revision(revision)
        ref = folder / "refs" / revision
        _require_inside(folder / "refs", ref.parent)
        ref.parent.mkdir(parents=True, exist_ok=True)
        _require_inside(folder / "refs", ref)

        atomic.write_text(ref, commit)
    return dest


def remove(cache: Path, entry: CachedFile) -> list[Path]:
    """Delete one cached file: its snapshot link, and its blob when no other
    snapshot points at it; then folders left empty. Returns what was deleted."""
    folder = repo_folder(cache, entry.repo_id)
    deleted: list[Path] = []
    others = [
        p for p in (folder / "snapshots").rglob("*")
        if p != entry.path and p.is_symlink() and _points_to(p, entry.blob)
    ]
    if not inside(folder / "snapshots", entry.path.parent):
        raise InputError(f"refusing to delete {safe(str(entry.path))}: it resolves outside {folder}")
    entry.path.unlink(missing_ok=True)
    deleted.append(entry.path)
    if not others and inside(folder / "blobs", entry.blob) and entry.blob.exists():
        entry.blob.unlink()
        deleted.append(entry.blob)
    # prune empty folders up to the snapshot root, then refs to vanished commits
    d = entry.path.parent
    while d != folder / "snapshots" and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
        d = d.parent
    refs = folder / "refs"
    if refs.is_dir():
        for ref in [p for p in refs.rglob("*") if p.is_file()]:
            commit = ref.read_text(encoding="utf-8").strip()
            if not (folder / "snapshots" / commit).exists():
                ref.unlink()
    return deleted


def _points_to(link_path: Path, blob: Path) -> bool:
    try:
        return link_path.resolve() == blob
    except (OSError, RuntimeError):
        return False
