"""Recompute the planner's 4 GiB / 6 GiB verdicts in ``models/catalog.toml``.

    python -m scripts.catalog_verdicts          # print them, and whether the file agrees
    python -m scripts.catalog_verdicts --write  # store them in the file

``tests/store/test_pull.py`` fails when the stored verdicts drift from the planner.
"""

from __future__ import annotations

import argparse
import re
from importlib.resources import as_file, files

from localllm.store import curated


def updated_text(text: str) -> str:
    models = curated.load(text)
    by_file = {f.file: (m, f) for m in models for f in m.files}

    def fix(match: re.Match[str]) -> str:
        line = match.group(0)
        file = re.search(r'file = "([^"]+)"', line).group(1)  # type: ignore[union-attr]
        m, f = by_file[file]
        for key in curated.BUDGETS:
            v = curated.judge(m, f, key).text
            line = re.sub(rf'fits_{key} = "[^"]*"', f'fits_{key} = "{v}"', line)
        return line

    return re.sub(r"^files\.[A-Z0-9_]+ = \{.*\}$", fix, text, flags=re.MULTILINE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    text = curated.catalog_text()
    new = updated_text(text)
    for r in curated.rows():
        print(f"{r['name']:<26} {r['quant']:<7} {r['size_bytes'] / 2**30:>5.2f} GiB  4 GiB: {r['fits_4gib']:<34} 6 GiB: {r['fits_6gib']}")
    if a.write:
        with as_file(files("localllm.models").joinpath("catalog.toml")) as path:
            path.write_text(new, encoding="utf-8")
        print("written")
    else:
        print("the file agrees" if new == text else "the file is stale: run with --write")


if __name__ == "__main__":
    main()
