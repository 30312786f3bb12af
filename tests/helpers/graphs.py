"""Import circles in a module graph, for the architecture tests."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Each back edge of a depth-first walk, as the circle it closes; a package's
    ``__init__`` that re-exports its own modules is not counted as one."""
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                found.append([*stack[stack.index(n):], n])
            elif n not in state:
                walk(n)
        stack.pop()
        state[m] = 2

    # deep enough for a long chain of imports, for this walk only: a raised limit
    # left behind would change what other tests in the process see (a deep input
    # that must overflow would not)
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous, 10_000))
    try:
        for m in sorted(graph):
            if m not in state:
                walk(m)
    finally:
        sys.setrecursionlimit(previous)
    return [c for c in found if not all(x == c[0] or x.startswith(c[0] + ".") or c[0].startswith(x + ".") for x in c)]
