"""Registries by name: algorithms, freeze policies, models and data sets are looked up here."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from fedbug.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object map that refuses duplicates and names the known entries on a miss."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise ConfigError(unknown_name_message(self.kind, name, self.names())) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def items(self) -> list[tuple[str, T]]:
        return sorted(self._items.items())

    def names(self) -> list[str]:
        return sorted(self._items)


def unknown_name_message(kind: str, name: str, known: Iterable[str]) -> str:
    """``unknown KIND 'x' (did you mean 'y'?); known: a, b`` in one line (``known`` in the
    order given), then how a name of the user's own becomes known (:func:`own_hint`) where a
    user registers that kind: the registries' misses and the config's validation say it so."""
    names = [str(k) for k in known]
    close = difflib.get_close_matches(str(name), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    own = own_hint(kind)
    return f"unknown {kind} {name!r}{hint}; known: {', '.join(names)}" + (f"; {own}" if own else "")


#: the kinds of name a user may register in a module of their own, as the hint names them
_OWN = {
    "algorithm": "an algorithm",
    "policy": "a policy",
    "freeze policy": "a policy",
    "selection": "a selection",
    "model": "a model",
    "dataset": "a data set",
    "method": "an algorithm",  # no method registry: a registered algorithm is a method: name
}


def own_hint(kind: str) -> str:
    """How a name of ``kind`` of the user's own becomes known (``a policy of your own: register
    it in a module and pass --import MODULE``); "" for a kind a user does not register."""
    what = _OWN.get(kind)
    if what is None:
        return ""
    also = ", or name its class 'package.module:Name'" if kind == "model" else ""
    return f"{what} of your own: register it in a module and pass --import MODULE{also}"


def register_all(package: str, path: list[str]) -> None:
    """Import every module of ``package`` (one method a file): each registers itself."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(path), key=lambda m: m.name):
        if not info.name.startswith("_") and info.name != "base":
            importlib.import_module(f"{package}.{info.name}")
