"""``localllm pull``: GGUFs from the Hugging Face Hub into the Hugging Face cache.

The only module that imports ``huggingface_hub`` (0.18 s to import, so only
``pull`` pays it). huggingface_hub finds the endpoint (``HF_ENDPOINT``), the
token and the repo's file list; we do the transfer ourselves because its
downloader keeps no partial file between runs (a process-unique temporary file,
deleted on failure) and checks sizes but not checksums. Ours:

- writes ``blobs/<etag>.incomplete`` and resumes it with an HTTP Range request
  after a dropped connection or a Ctrl+C, in this run or the next;
- checks the sha256 (the etag of an LFS file) before the blob takes its name;
- links ``snapshots/<commit>/<file>`` to it the way huggingface_hub does, under
  the same lock file, so the file is stored once and every tool sees it.

Offline (``--offline`` or ``HF_HUB_OFFLINE=1``) nothing here opens a socket:
the cache answers, or one line says the file is not cached.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from localllm import paths
from localllm.errors import InputError, LocalLLMError
from localllm.store import hf_cache, registry
from localllm.store.modelname import is_projector, pick_projector, quant_of, split_names, split_part
from localllm.util import atomic, fmt
from localllm.util.progress import Bar

_CHUNK = 1 << 20
_RETRIES = 5  # attempts after the first, each after a dropped or silent connection (LOCALLLM_PULL_RETRIES)
_MAX_RETRIES = 100


@dataclass(frozen=True)
class RemoteFile:
    filename: str
    size: int
    quant: str | None


@dataclass
class PullResult:
    repo_id: str
    filename: str
    revision: str
    commit: str
    path: str
    size: int
    etag: str
    name: str  # the registry name to use with run/chat/...
    downloaded_bytes: int  # 0 when it was in the cache already
    resumed_from: int  # bytes kept from an earlier, interrupted try
    verified: bool  # the checksum was computed and matched
    from_cache: bool
    reason: str  # why this file (asked for, --quant, the largest that fits --vram)
    projector: str | None = None  # the vision projector pulled beside it (pull_all), where the repo has one

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Progress:
    """Where one file's transfer stands, for a caller that shows it its own way
    (``on_progress``: the router's ``/api/pull`` streams it as Ollama's NDJSON).
    Reported as the transfer starts (``completed``: the bytes kept from an earlier
    try), after each chunk, before each retry, and once with ``completed ==
    total`` for a file found in the cache. An exception the callback raises stops
    the pull there; the partial file stays for the next pull to resume."""

    filename: str
    sha256: str  # the etag: the file's sha256 for an LFS file
    total: int
    completed: int


OnProgress = Callable[[Progress], None]


def offline(flag: bool) -> bool:
    """``--offline``, or huggingface_hub's own switch (read here, so that offline
    runs never import the library)."""
    return flag or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


# -- choosing a file ---------------------------------------------------------------


_LISTED_PROJECTORS: dict[tuple[str, str], list[RemoteFile]] = {}  # (repo, revision): the last listing's projectors, taken once


def list_ggufs(repo_id: str, revision: str, *, projectors: bool = False) -> list[RemoteFile]:
    """The GGUF models in a repo (no vision projectors), from the Hub's tree API.
    Asked directly, without huggingface_hub's retry back-off (23 s when the Hub is
    unreachable): one try, one line."""
    from urllib.parse import quote

    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers

    url: str | None = f"{_endpoint()}/api/models/{repo_id}/tree/{quote(revision, safe='')}?recursive=true"
    items: list[dict[str, Any] | None] = []  # None: a page that was not a list (refused below)
    while url:
        with _hub_errors(repo_id):
            # connect and read time-outs (huggingface_hub's download time-out): a stalled hub is one line, not a hang
            resp = get_session().get(url, headers=build_hf_headers(), timeout=_timeout())
            _raise_for_status(resp)
        try:
            page = resp.json()
        except ValueError:
            raise InputError(f"{endpoint_name()} sent a file list for {repo_id} that is not JSON") from None
        items += page if isinstance(page, list) else [None]
        url = resp.links.get("next", {}).get("url")
    if not isinstance(items, list):
        raise InputError(f"{endpoint_name()} sent a file list for {repo_id} that is not a list")
    models: list[RemoteFile] = []
    projs: list[RemoteFile] = []
    skipped = 0
    for it in items:
        if not isinstance(it, dict):
            continue
        name = it.get("path")
        if not isinstance(name, str) or it.get("type") != "file" or not name.lower().endswith(".gguf"):
            continue
        size = it.get("size")
        if hf_cache.unsafe_filename(name) is not None or not isinstance(size, int) or size < 0:
            skipped += 1  # the server's listing is untrusted: such a name never becomes a path
            continue
        (projs if is_projector(name) else models).append(RemoteFile(name, size, quant_of(name)))
    if skipped:
        print(f"localllm: skipped {skipped} file(s) of {repo_id} whose names or sizes are unsafe", file=sys.stderr)
    # the vision projectors, or the models and, kept for the pull that follows, the projectors (pull_all fetches
    # the model's beside it without listing the repo a second time)
    _LISTED_PROJECTORS[(repo_id, revision)] = projs
    return projs if projectors else models


def cached_ggufs(repo_id: str, revision: str) -> list[RemoteFile]:
    cache = paths.hf_hub_cache()
    commit = hf_cache.commit_for(cache, repo_id, revision)
    return [
        RemoteFile(f.filename, f.size, quant_of(f.filename))
        for f in hf_cache.scan(cache, repo_id)
        if (commit is None or f.commit == commit) and not is_projector(f.filename)
    ]


def pick_by_quant(files: list[RemoteFile], quant: str, repo_id: str, offline_mode: bool = False) -> RemoteFile:
    want = quant.upper()
    hits = [f for f in files if f.quant == want]
    if not hits:
        have = ", ".join(sorted({f.quant or f.filename for f in files})) or "no quant-named GGUFs"
        if offline_mode:
            raise InputError(f"{repo_id} {want} is not cached (offline; cached: {have}): run without --offline to download it")
        raise InputError(f"{repo_id} has no {want} file (it has: {have}): pick one with --quant or --file")
    # a single file, else the first part of a split one (llama.cpp loads the parts from it)
    firsts = [f for f in hits if (split_part(f.filename) or (1, 1))[0] == 1]
    return min(firsts or hits, key=lambda f: (split_part(f.filename) is not None, len(f.filename)))


def parts_of(f: RemoteFile, files: list[RemoteFile], repo_id: str) -> list[RemoteFile]:
    """``f`` and, for the first part of a split model, every other part, in order."""
    want = split_names(f.filename)
    by_name = {x.filename: x for x in files}
    missing = [n for n in want if n not in by_name]
    if missing:
        raise InputError(f"{repo_id} lists {len(want) - len(missing)} of the {len(want)} parts of {f.filename} (no {missing[0]})")
    return [by_name[n] for n in want]


def pull_all(repo_id: str, filename: str, revision: str, *, progress: bool, reason: str, offline_mode: bool,
             on_progress: OnProgress | None = None) -> PullResult:
    """``pull`` of one file, or of every part of a split model given its first
    part (each verified and stored the same way): the first part's result, with
    the sizes and downloads of all the parts summed."""
    results = [pull(repo_id, name, revision, progress=progress, reason=reason, offline_mode=offline_mode, on_progress=on_progress)
               for name in split_names(filename)]
    first = results[0]
    proj = _pull_projector(repo_id, filename, revision, progress=progress, offline_mode=offline_mode, on_progress=on_progress)
    return replace(first, size=sum(r.size for r in results), downloaded_bytes=sum(r.downloaded_bytes for r in results),
                   resumed_from=sum(r.resumed_from for r in results), verified=all(r.verified for r in results),
                   from_cache=all(r.from_cache for r in results), projector=proj.path if proj is not None else None)


def _pull_projector(repo_id: str, filename: str, revision: str, *, progress: bool, offline_mode: bool,
                    on_progress: OnProgress | None) -> PullResult | None:
    """The vision projector beside ``filename`` in the repo (``pick_projector``), pulled
    as any file (resumed, its sha256 checked) into the same snapshot, where
    ``vision.projector.beside`` finds it; None for a repo without one."""
    if is_projector(filename):
        return None
    if offline_mode:
        cache = paths.hf_hub_cache()
        commit = hf_cache.commit_for(cache, repo_id, revision)
        files = [(f.filename, f.size) for f in hf_cache.scan(cache, repo_id) if (commit is None or f.commit == commit)]
    else:
        listed = _LISTED_PROJECTORS.pop((repo_id, revision), None)  # the listing that chose the model, moments ago
        files = [(f.filename, f.size) for f in (listed if listed is not None else list_ggufs(repo_id, revision, projectors=True))]
    name = pick_projector(filename, files)
    if name is None:
        return None
    return pull(repo_id, name, revision, progress=progress, reason=f"the vision projector of {filename}", offline_mode=offline_mode,
                on_progress=on_progress)


def pick_by_budget(files: list[RemoteFile], judge_of: Callable[[RemoteFile], Any], gpu_budget: int) -> tuple[RemoteFile, str]:
    """The largest file whose verdict (``judge_of``: a ``verdict.Verdict``) is
    'every layer on the GPU'. Judged largest first; the search stops at the first
    fit. A mixture of experts whose experts must stay in RAM for that (and whose
    RAM holds them: the verdict checks) is the choice only when no quant fits
    the GPU whole: then the largest such one."""
    candidates = sorted((f for f in files if split_part(f.filename) is None and f.quant), key=lambda f: -f.size)
    if not candidates:
        raise InputError("no single-file, quant-named GGUF in this repo to choose from: name one with --file")
    tried: list[str] = []
    in_ram: tuple[RemoteFile, str] | None = None  # the largest that fits with its experts in RAM
    for f in candidates:
        v = judge_of(f)
        if v.full_gpu and not v.n_cpu_moe:
            why = f"the largest quant that fits {fmt.size(gpu_budget)} with every layer on the GPU ({v.text})"
            if tried:
                why += f" (larger: {', '.join(tried)})"
            return f, why
        if v.full_gpu and in_ram is None:
            in_ram = f, (f"the largest quant that fits {fmt.size(gpu_budget)} with every layer's attention on the GPU and the experts "
                         f"in RAM, as none fits the GPU whole ({v.text})")
        tried.append(f"{f.quant} {v.text}")
    if in_ram is not None:
        return in_ram
    raise InputError(
        f"no quant of this model fits {fmt.size(gpu_budget)} with every layer on the GPU "
        f"(smallest, {candidates[-1].quant}: {tried[-1].split(' ', 1)[1]}): try a smaller model or a larger --vram"
    )


def remote_header(repo_id: str, revision: str, f: RemoteFile):
    """Read a remote file's GGUF header with Range requests (4 MiB, doubling),
    so the planner can judge a quant before it is downloaded."""
    return remote_prefix(repo_id, revision, f)[0]


def remote_prefix(repo_id: str, revision: str, f: RemoteFile):
    """``remote_header`` and the file's bytes up to its tensor data (the header
    and its padding): enough for llama.cpp's dry run on a sparse stub
    (``modelfile.stub``)."""
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    # lazy: loads gguf, numpy (~87 ms here), which hub does not load at import
    from localllm.modelfile.gguf_file import parse_prefix

    url = hf_hub_url(repo_id, f.filename, revision=revision)
    n = 4 << 20
    while True:
        headers = {**build_hf_headers(), "Range": f"bytes=0-{min(n, f.size) - 1}", "Accept-Encoding": "identity"}
        data = bytearray()
        with _hub_errors(repo_id, f.filename), get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=_timeout()) as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for_status(resp)
            # a server that ignores the Range would send the whole file: read what was asked for only
            for chunk in resp.iter_bytes(_CHUNK):
                data += chunk
                if len(data) >= n:
                    break
        header = parse_prefix(f"{repo_id}/{f.filename}", bytes(data[:n]), f.size)
        if header is not None and len(data) >= header.data_offset:
            return header, bytes(data[: header.data_offset])
        if n >= f.size:
            raise InputError(f"{repo_id}/{f.filename} is a truncated GGUF file on the server")
        n *= 2


# -- the transfer --------------------------------------------------------------------


def pull(repo_id: str, filename: str, revision: str, *, progress: bool, reason: str, offline_mode: bool,
         on_progress: OnProgress | None = None) -> PullResult:
    """One file into the cache: resumed, its sha256 checked, linked as
    huggingface_hub links it. ``progress``: the bar on stderr; ``on_progress``: each
    step given to the caller as well (``Progress``)."""
    cache = paths.hf_hub_cache()
    # Every code path (--file, REPO:QUANT, --vram picks) ends here: check again.
    hf_cache.check_repo_id(repo_id)
    hf_cache.check_revision(revision)
    hf_cache.check_remote_filename(filename)
    if offline_mode:
        result = _from_cache(cache, repo_id, filename, revision, reason)
        if on_progress is not None:
            on_progress(Progress(filename, result.etag, result.size, result.size))
        return result
    from filelock import FileLock
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    with _hub_errors(repo_id, filename):
        meta = get_hf_file_metadata(hf_hub_url(repo_id, filename, revision=revision))
    if not meta.commit_hash or not meta.etag or meta.size is None:
        raise InputError(f"the server sent no commit, checksum or size for {repo_id}/{filename}; cannot store it safely")
    etag, commit = meta.etag, hf_cache.check_commit(meta.commit_hash)
    try:
        size = int(meta.size)
    except (TypeError, ValueError):
        size = -1
    if size < 0:
        raise InputError(f"the server sent an invalid size for {repo_id}/{filename}; nothing was written")
    hf_cache.snapshot_path(cache, repo_id, commit, filename)  # refuse before downloading, not after
    blob = hf_cache.blob_path(cache, repo_id, etag)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = cache / ".locks" / hf_cache.repo_folder(cache, repo_id).name / f"{etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    downloaded = resumed = 0
    verified = False
    with FileLock(str(lock)):
        if blob.is_file() and blob.stat().st_size == size:
            if on_progress is not None:
                on_progress(Progress(filename, etag, size, size))
        else:
            resumed, downloaded, digest = _download(meta.location, blob, size, etag, filename, progress, repo_id, on_progress)
            part = blob.with_name(blob.name + ".incomplete")
            if digest != etag:
                part.unlink(missing_ok=True)
                raise InputError(
                    f"checksum mismatch for {filename}: the bytes received do not hash to {etag[:12]}…; "
                    "the partial file was removed, run the same command to download it again"
                )
            verified = True
            atomic.commit(part, blob)
        dest = hf_cache.link(cache, repo_id, revision, commit, filename, blob)
    registry.record_pull(repo_id, filename, revision, commit, etag, size, stored=verified)
    name = _registry_name(repo_id, filename)
    return PullResult(repo_id, filename, revision, commit, str(dest), size, etag, name, downloaded, resumed, verified, not verified, reason)


def _from_cache(cache: Path, repo_id: str, filename: str, revision: str, reason: str) -> PullResult:
    found = hf_cache.lookup(cache, repo_id, filename, revision)
    if found is None:
        raise InputError(f"{repo_id}/{filename} is not cached (offline: nothing was downloaded); run without --offline to download it")
    etag = found.blob.name
    registry.record_pull(repo_id, filename, revision, found.commit, etag, found.size, stored=False)
    return PullResult(
        repo_id,
        filename,
        revision,
        found.commit,
        str(found.path),
        found.size,
        etag,
        _registry_name(repo_id, filename),
        0,
        0,
        False,
        True,
        reason,
    )


def _registry_name(repo_id: str, filename: str) -> str:
    for e in registry.discover():
        if e.repo == repo_id and e.filename == filename and e.source in ("pulled", "hf-cache"):
            return e.name
    return f"{repo_id}/{filename}"


def _download(url: str, blob: Path, size: int, etag: str, label: str, progress: bool, repo_id: str,
              on_progress: OnProgress | None = None) -> tuple[int, int, str]:
    """Fill ``<blob>.incomplete`` up to ``size`` bytes, resuming what is there,
    hashing as the bytes arrive (the kept part is hashed first), so the file is
    read once. Returns (bytes kept from before, bytes fetched now, the digest).
    ``on_progress`` hears of each step (``Progress``)."""
    import httpx2
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers

    part = blob.with_name(blob.name + ".incomplete")
    if part.is_symlink() or not hf_cache.inside(blob.parent, part):
        raise InputError(f"refusing to write {hf_cache.safe(str(part))}: it is a link or resolves outside {blob.parent}")
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    kept = have
    digest = hf_cache.hash_file(part, etag, size) if have else hf_cache.hasher(etag, size)
    _check_space(part.parent, size - have)

    bar = Bar(f"downloading {label}", size, done=have, enabled=progress)

    def report() -> None:
        if on_progress is not None:
            on_progress(Progress(label, etag, size, have))

    retries = most = _retries()
    try:
        report()
        with open(part, "ab") as out:
            while have < size:
                # the token goes to the Hub only, never to the CDN it redirects to
                headers = {**(build_hf_headers() if _same_origin(url, _endpoint()) else {}), "Accept-Encoding": "identity"}
                if have:
                    headers["Range"] = f"bytes={have}-"
                try:
                    with get_session().stream("GET", url, headers=headers, follow_redirects=True, timeout=_timeout()) as resp:
                        if resp.status_code == 200 and have:
                            out.seek(0)  # the server ignored the Range: start over
                            out.truncate()
                            bar.restart()
                            kept = have = 0
                            report()
                            digest = hf_cache.hasher(etag, size)
                        elif resp.status_code not in (200, 206):
                            resp.read()
                            with _hub_errors(repo_id, label):
                                _raise_for_status(resp)
                        for data in resp.iter_bytes(_CHUNK):
                            if have + len(data) > size:
                                out.close()
                                part.unlink(missing_ok=True)
                                raise InputError(
                                    f"the server sent more than the {size} bytes it announced for {hf_cache.safe(label)}; the partial file was removed"
                                )
                            out.write(data)
                            digest.update(data)
                            have += len(data)
                            bar.advance(len(data))
                            retries = most
                            report()
                    out.flush()
                except httpx2.TooManyRedirects:
                    raise InputError(
                        f"the download of {hf_cache.safe(label)} redirected too many times (a redirect loop?); {_mb(have)} of {_mb(size)} kept"
                    ) from None
                except (httpx2.TransportError, httpx2.TimeoutException) as exc:
                    out.flush()
                    retries -= 1
                    if retries < 0:
                        raise InputError(
                            f"download of {label} failed ({type(exc).__name__}); {_mb(have)} of {_mb(size)} kept: run the same command to resume"
                        ) from None
                    time.sleep(0.5)
                    report()  # before the retry: the caller may stop here
                    continue
                if have < size and resp.status_code in (200, 206):
                    retries -= 1  # the body ended early; ask again for the rest
                    if retries < 0:
                        raise InputError(f"the server kept ending {label} early; {_mb(have)} of {_mb(size)} kept: run the same command to resume")
        if have != size:
            raise InputError(f"{label}: received {have} bytes, expected {size}; run the same command to resume")
    except KeyboardInterrupt:
        bar.close()
        print(f"localllm: interrupted: {_mb(have)} of {_mb(size)} kept; run the same command to resume", file=sys.stderr)
        raise
    finally:
        bar.close()  # also before an error's one line, so it is not drawn over
    return kept, have - kept, digest.hexdigest()


def _retries() -> int:
    """How many times a download asks again after its connection dropped or went
    silent past the read time-out, with no byte in between (``LOCALLLM_PULL_RETRIES``,
    0 to 100; default 5). Each time costs up to HF_HUB_DOWNLOAD_TIMEOUT seconds."""
    raw = os.environ.get("LOCALLLM_PULL_RETRIES", "").strip()
    if not raw:
        return _RETRIES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= _MAX_RETRIES:
        raise InputError(f"LOCALLLM_PULL_RETRIES must be a whole number from 0 to {_MAX_RETRIES}, got {fmt.safe(raw)[:40]!r}")
    return value


def _same_origin(a: str, b: str) -> bool:
    from urllib.parse import urlparse

    pa, pb = urlparse(a), urlparse(b)
    return (pa.scheme, pa.hostname, pa.port) == (pb.scheme, pb.hostname, pb.port)


def _check_space(folder: Path, need: int) -> None:
    import shutil

    free = shutil.disk_usage(folder).free
    if free < need:
        raise InputError(f"not enough disk space in {folder}: need {_mb(need)}, {_mb(free)} free")


def _mb(n: int) -> str:
    return fmt.size(n)


def _raise_for_status(resp: Any) -> None:
    from huggingface_hub.utils import hf_raise_for_status

    hf_raise_for_status(resp)


class _hub_errors:
    """Turn huggingface_hub's and the network's errors into one line."""

    def __init__(self, repo_id: str, filename: str | None = None) -> None:
        self.what = hf_cache.safe(f"{repo_id}/{filename}" if filename else repo_id)
        self.repo_id = repo_id

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None or isinstance(exc, (LocalLLMError, KeyboardInterrupt)):
            return False
        import httpx2
        from huggingface_hub import errors as e

        endpoint = _endpoint()
        if isinstance(exc, e.OfflineModeIsEnabled):
            raise InputError(f"{self.what} is not cached and offline mode is on (HF_HUB_OFFLINE=1)") from None
        if isinstance(exc, e.GatedRepoError):
            raise InputError(f"{self.repo_id} is gated: accept its license on {endpoint}/{self.repo_id}, then set HF_TOKEN or run hf auth login") from None
        if isinstance(exc, e.RepositoryNotFoundError):
            raise InputError(f"no repo {self.repo_id} on {endpoint} (or it is private: set HF_TOKEN)") from None
        if isinstance(exc, e.RevisionNotFoundError):
            raise InputError(f"{self.repo_id} has no such revision") from None
        if isinstance(exc, e.EntryNotFoundError):
            raise InputError(f"{self.what} does not exist: see the repo's files, or use --quant") from None
        if isinstance(exc, httpx2.TooManyRedirects):
            raise InputError(f"{endpoint} redirected too many times for {self.what} (a redirect loop?)") from None
        if isinstance(exc, e.HfHubHTTPError):
            status = getattr(getattr(exc, "response", None), "status_code", "?")
            raise InputError(f"{endpoint} answered HTTP {status} for {self.what}") from None
        if isinstance(exc, (httpx2.TransportError, httpx2.TimeoutException, OSError)):
            raise InputError(f"cannot reach {endpoint} ({type(exc).__name__}): check the network, or use --offline for cached files") from None
        return False


def _timeout() -> float:
    from huggingface_hub import constants

    return float(constants.HF_HUB_DOWNLOAD_TIMEOUT)


def endpoint_name() -> str:
    return hf_cache.safe(_endpoint())


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT
