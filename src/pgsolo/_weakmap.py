"""A map from objects to values that holds its keys weakly and tells them apart by
identity, as pgsolo's books of connections need. :class:`weakref.WeakKeyDictionary` makes
a new weak reference, and hashes it, on every lookup, and every lock looks its connection
up several times: here a lookup is a dict lookup by ``id()`` and one call of the stored
reference."""

from __future__ import annotations

import functools
import weakref
from typing import Generic, TypeVar

__all__ = ["IdentityWeakMap", "drop_entry"]

K = TypeVar("K")
V = TypeVar("V")


class IdentityWeakMap(Generic[K, V]):
    """``obj -> value`` while ``obj`` lives; the entry goes with it."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[K], V]] = {}

    def get(self, obj: K) -> V | None:
        entry = self._entries.get(id(obj))
        # The reference tells a live key from one whose id a new object now has.
        if entry is not None and entry[0]() is obj:
            return entry[1]
        return None

    def __setitem__(self, obj: K, value: V) -> None:
        ident = id(obj)
        gone = functools.partial(drop_entry, self._entries, ident)
        self._entries[ident] = (weakref.ref(obj, gone), value)

    def pop(self, obj: K) -> V | None:
        # One step, so that an interruption (a Ctrl-C lands at any line) leaves the entry
        # either there or gone. While ``obj`` lives, an entry under its id is its own: a
        # dead key's entry went as it died (drop_entry), before its id could be reused.
        entry = self._entries.pop(id(obj), None)
        return entry[1] if entry is not None else None


def drop_entry(
    entries: dict[int, tuple[weakref.ref[K], V]], ident: int, ref: weakref.ref[K]
) -> None:
    """A key died: its entry goes. Called as the key dies, before its id can be reused;
    only the entry made with this reference goes (a later one for the same key replaced
    it). Runs wherever the key happens to die, so it is on no lock's path."""
    entry = entries.get(ident)
    if entry is not None and entry[0] is ref:
        del entries[ident]
