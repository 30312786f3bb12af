"""The cockpit session's state, named on the app: ``LocalLLMApp.chat`` is its
``CockpitSession``'s ``chat`` (one place holds it; the app's screens read it)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class Of(Generic[T]):
    """An attribute of the app that is its session's (``app.core``): read and set
    there, so that the app's handlers, its mixins and the tests read ``app.chat``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, app: None, owner: type) -> Of[T]: ...
    @overload
    def __get__(self, app: object, owner: type | None = None) -> T: ...
    def __get__(self, app: object, owner: type | None = None) -> Any:
        return self if app is None else getattr(app.core, self.name)  # type: ignore[attr-defined]

    def __set__(self, app: object, value: T) -> None:
        setattr(app.core, self.name, value)  # type: ignore[attr-defined]
