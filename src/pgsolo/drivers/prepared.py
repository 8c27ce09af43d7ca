"""pgsolo's lock calls prepared once per session (:class:`pgsolo.sql.Prepared`), as psycopg
prepares its caller's statements: a call is prepared once it has run ``threshold`` times
on a session, and runs by name after that. What each session has, by its connection
object, is kept here, with the driver's handle of each statement where it has one
(asyncpg's statement state: never an object that refers to the connection, which this
module's books would keep alive).

A driver prepares a lock call only outside any transaction, where the error of a
missing or duplicate statement aborts nothing and nothing ran: the server may have
dropped pgsolo's statements (the caller ran ``DEALLOCATE ALL`` or ``DISCARD ALL``: the
call is then sent as written, and prepared again later), or have one already (a pooled
session pgsolo used before, through another connection object: it is used as it is,
its name being a digest of its text)."""

from __future__ import annotations

import enum

from .._weakmap import IdentityWeakMap
from ..sql import SQLSTATE_DUPLICATE_PREPARED, SQLSTATE_NO_PREPARED

__all__ = ["AS_WRITTEN", "BY_NAME", "PREPARE", "How", "forget", "how", "made"]


class How(enum.Enum):
    """How to send a lock call this time."""

    AS_WRITTEN = "as a simple query"
    PREPARE = "prepare it, then run it by name"
    BY_NAME = "run it by name: the session has it"


# The members as names of this module too: every lock compares with them, and looking a
# member up in its enum costs 55 ns on Python 3.11, a module's name 7 (see _psycopg).
AS_WRITTEN, PREPARE, BY_NAME = How.AS_WRITTEN, How.PREPARE, How.BY_NAME


class _Ready:
    """A statement the session has, and the driver's handle of it."""

    __slots__ = ("handle",)

    def __init__(self, handle: object) -> None:
        self.handle = handle


# Per session: how many times each lock call ran as written, or its _Ready once prepared.
_SEEN: IdentityWeakMap[object, dict[bytes, int | _Ready]] = IdentityWeakMap()


def how(conn: object, name: bytes, threshold: int) -> tuple[How, object]:
    """How to send the lock call ``name`` on ``conn`` this time, counting it; with
    ``BY_NAME``, the driver's handle of the statement (None where it keeps none)."""
    seen = _SEEN.get(conn)  # as _seen() does, without its call: every lock comes here
    if seen is None:
        seen = _SEEN[conn] = {}
    runs = seen.get(name, 0)
    if isinstance(runs, _Ready):
        return BY_NAME, runs.handle
    if runs >= threshold:
        return PREPARE, None
    seen[name] = runs + 1
    return AS_WRITTEN, None


def made(
    conn: object, name: bytes, sqlstate: str | None, handle: object = None
) -> tuple[How, object]:
    """After pgsolo prepared ``name`` on ``conn``, which failed with ``sqlstate`` (None: it
    did not fail; ``handle``: the driver's handle of it): how to send the call now, as
    :func:`how` says it. A duplicate is pgsolo's own (the name is a digest of the text);
    any other failure leaves the call as written, and counted again from nothing."""
    seen = _seen(conn)
    if sqlstate is None or sqlstate == SQLSTATE_DUPLICATE_PREPARED:
        seen[name] = _Ready(handle)
        return BY_NAME, handle
    seen[name] = 0
    return AS_WRITTEN, None


def forget(conn: object, sqlstate: str | None) -> bool:
    """Whether a run by name failed because the session no longer has the statement (the
    caller dropped all of them: they are forgotten, to be prepared again)."""
    if sqlstate != SQLSTATE_NO_PREPARED:
        return False
    _SEEN.pop(conn)
    return True


def _seen(conn: object) -> dict[bytes, int | _Ready]:
    seen = _SEEN.get(conn)
    if seen is None:
        seen = _SEEN[conn] = {}
    return seen
