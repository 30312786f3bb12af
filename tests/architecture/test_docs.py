"""The documentation covers the CLI and stays for users.

Every command and every option string the parser knows (``localllm.cli.build_parser()``,
its subparsers walked as argparse built them, never its help text) appears somewhere
in README.md or docs/**/*.md; the README stays short; README and docs/ carry no
issue numbers or commit hashes (history belongs in CHANGELOG.md); and their
relative links lead to pages and headings that exist."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

from localllm.cli import build_parser
from tests.helpers.paths import REPO

README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 400


def _pages() -> list[Path]:
    """README.md and every Markdown page under docs/ (CHANGELOG.md is history, not reference)."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def _text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in _pages())


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(the command's words, its parser) for the top level and every subcommand, nested ones included."""
    yield path, parser
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to its subparsers
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _mentioned(option: str, text: str) -> bool:
    """``option`` as a word of its own: ``--ctx`` is not found in ``--ctx-size``, nor ``-c`` in ``-ctk``."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def test_every_command_is_documented() -> None:
    text = _text()
    missing = [
        "localllm " + " ".join(path)
        for path, _ in _commands(build_parser())
        if path and not re.search(rf"\blocalllm {re.escape(' '.join(path))}\b", text)
    ]
    assert not missing, "commands not shown as 'localllm COMMAND' in README.md or docs/**/*.md:\n  " + "\n  ".join(missing)


def test_every_option_is_documented() -> None:
    """Hidden options too (serve's refused llama-server flags, the router's --default-model):
    a user who types one gets an answer that the docs should explain."""
    text = _text()
    missing = []
    for path, parser in _commands(build_parser()):
        for action in parser._actions:  # noqa: SLF001
            if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
                continue
            for option in action.option_strings:
                if not _mentioned(option, text):
                    hint = "(hidden)" if action.help == argparse.SUPPRESS else f"({action.help})"
                    missing.append(f"localllm {' '.join(path)} {option} {hint}".replace("  ", " "))
    assert not missing, (
        f"{len(missing)} option(s) appear nowhere in README.md or docs/**/*.md; document each "
        "(its help string says what it does):\n  " + "\n  ".join(missing)
    )


def test_the_readme_is_short() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines < MAX_README_LINES, f"README.md has {lines} lines (under {MAX_README_LINES}): move reference to docs/"


# "issue 28", "issues 12", "Issue #59"; a bare "#59" too. Upstream citations ("llama.cpp #20824",
# "llama.cpp issue #20824") are fine: the words just before name llama.cpp.
ISSUE = re.compile(r"(?i)\bissues?\s*#?\d+|(?<![\w&/#])#\d+\b")
HEX = re.compile(r"(?<![\w-])`?([0-9a-f]{7,40})`?(?![\w-])")


def _upstream(text: str, start: int) -> bool:
    return "llama.cpp" in text[max(0, start - 24) : start]


def test_no_issue_numbers_or_commit_hashes_for_users() -> None:
    found = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(REPO)
        for m in ISSUE.finditer(text):
            if not _upstream(text, m.start()):
                found.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r} (an issue number: history goes to CHANGELOG.md)")
        for m in HEX.finditer(text):
            token = m.group(1)
            near = text[max(0, m.start() - 40) : m.end() + 40]
            if re.search(r"\d", token) and re.search(r"[a-f]", token) and re.search(r"(?i)\bcommit", near):
                found.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {token!r} (a commit hash: history goes to CHANGELOG.md)")
    assert not found, "\n".join(found)


def _anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_between_pages_resolve() -> None:
    broken = []
    for page in [*_pages(), REPO / "CHANGELOG.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_bounds_the_docs_state_are_the_codes() -> None:
    """The byte bounds users are told are the ones enforced (the router's body, an MCP
    server's message and flood line, serve's body with and without a projector),
    read from the constants, so a change to either side fails here."""
    from localllm.mcp.hub import MAX_MESSAGE_BYTES
    from localllm.mcp.transport import FLOOD_FACTOR
    from localllm.serve.app import MAX_BODY
    from localllm.serve.media import MEDIA_BODY

    mib = 2**20
    mcp = (DOCS / "mcp.md").read_text(encoding="utf-8")
    assert f"over {MAX_MESSAGE_BYTES // mib} MiB is dropped" in mcp
    assert f"at {FLOOD_FACTOR * MAX_MESSAGE_BYTES // mib} MiB (four times that) is a flood" in mcp and FLOOD_FACTOR == 4
    router = (DOCS / "router.md").read_text(encoding="utf-8")
    assert f"body of up to {MEDIA_BODY // mib} MiB" in router
    serve = (DOCS / "serve.md").read_text(encoding="utf-8")
    assert f"Bodies over {MAX_BODY // mib} MiB get 413 ({MEDIA_BODY // mib} MiB with a vision projector)" in serve
