"""A tiny name → object registry used for every pluggable choice (ARCHITECTURE.md, convention 5)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from vflink.errors import ConfigError, UnknownNameError

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Maps names such as ``"euclidean"`` to implementations.

    An unknown name raises :class:`~vflink.errors.UnknownNameError` listing the valid names.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            self.add(name, obj)
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        if name in self._items:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self._items) from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._items))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
