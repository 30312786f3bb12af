"""Other tools' model stores laid out on disk as they write them (Ollama's manifests and blobs)."""

from __future__ import annotations

import json
from pathlib import Path


def ollama_store(root: Path, blob_src: Path, name: str, tag: str, host: str = "registry.ollama.ai", ns: str = "library") -> Path:
    import hashlib

    data = blob_src.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    blob = root / "blobs" / f"sha256-{digest}"
    blob.write_bytes(data)
    manifest = root / "manifests" / host / ns / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(
        json.dumps(
            {
                "schemaVersion": 2,
                "layers": [
                    {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
                    {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 10},
                ],
            }
        )
    )
    return blob
