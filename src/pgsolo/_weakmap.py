"""A map from objects to values that holds its keys weakly and tells them apart by
identity, as pgsolo's books of connections need. :class:`weakref.WeakKeyDictionary` makes
a new weak reference, and hashes it, on every lookup, and every lock looks its connection
up several times: here a lookup is a dict lookup by ``id()``."""

from __future__ import annotations

import functools
import weakref
from typing import Generic, TypeVar

__all__ = ["IdentityWeakMap"]

K = TypeVar("K")
V = TypeVar("V")


class IdentityWeakMap(Generic[K, V]):
    """``obj -> value`` while ``obj`` lives; the entry goes with it."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[K], V]] = {}

    def get(self, obj: K) -> V | None:
        # No check that the entry's reference still points at ``obj``: an entry goes
        # while its key dies, before its id can be reused (see __setitem__).
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None else None

    def __setitem__(self, obj: K, value: V) -> None:
        ident = id(obj)
        # The entry goes as ``obj`` dies: the reference calls ``entries.pop(ident, ref)``.
        # That call runs no Python, so no interruption (a Ctrl-C lands at any line of
        # Python) can cut it short and leave an entry for a new object to inherit. The
        # entry under ``ident`` then is ``obj``'s own, if any: a replaced entry's
        # reference died with it, without a call, and any reference's call comes
        # before ``obj``'s id is free.
        gone = functools.partial(self._entries.pop, ident)
        self._entries[ident] = (weakref.ref(obj, gone), value)

    def pop(self, obj: K) -> V | None:
        # One step, so that an interruption (a Ctrl-C lands at any line) leaves the entry
        # either there or gone.
        entry = self._entries.pop(id(obj), None)
        return entry[1] if entry is not None else None
