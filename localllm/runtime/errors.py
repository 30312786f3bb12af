"""The load path's typed failures.

``DoesNotFit`` is an ``InputError`` (exit code 1, one line), so every front end
that raised ``InputError(f"does not fit: ...")`` by hand keeps its exit code and
its words, while a caller that wants the numbers catches the type and reads the
``Fit``. The router's own ``DoesNotFit`` (a 507) subclasses this one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from localllm.errors import EngineError, InputError

if TYPE_CHECKING:
    from localllm.plan.fitting import Fit


class DoesNotFit(InputError):
    """The model does not fit the budget, not even at the smallest settings the
    request leaves free: the message is "does not fit: <the fit's sentence>",
    ``fit`` the fitting service's answer (None where only the words travelled,
    as between the router's processes)."""

    def __init__(self, message: str, fit: Fit | None = None) -> None:
        super().__init__(message)
        self.fit = fit

    @classmethod
    def of(cls, fit: Fit) -> DoesNotFit:
        return cls(f"does not fit: {fit.sentence}", fit)


class NoImages(EngineError):
    """The engine cannot load a projector (the scripted fake): a vision model runs text only."""
