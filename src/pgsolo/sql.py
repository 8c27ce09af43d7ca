"""Every SQL statement pgsolo sends, in one place.

Statements are plain text with no bind parameters so that several of them can travel in
one simple-query message (one round trip). That is safe because the only values spliced
in are Python ints validated by :class:`~pgsolo.keys.Key` and millisecond counts that are
ints by construction; nothing from a user is ever quoted into SQL here.
"""

from __future__ import annotations

from typing import Literal

from .keys import Key, encode_pg_lock

Lifetime = Literal["xact", "session"]

BEGIN = "BEGIN"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
UNLOCK_ALL = "SELECT pg_advisory_unlock_all()"

# A wait inside the caller's transaction runs in a savepoint: rolling back to it restores
# lock_timeout and keeps the caller's transaction usable, while a session-level advisory
# lock survives the rollback (PostgreSQL: session locks ignore transaction semantics).
WAIT_SAVEPOINT = "SAVEPOINT pgsolo_lock_wait"
WAIT_SAVEPOINT_UNDO = "ROLLBACK TO SAVEPOINT pgsolo_lock_wait"
WAIT_SAVEPOINT_RELEASE = "RELEASE SAVEPOINT pgsolo_lock_wait"

SQLSTATE_LOCK_NOT_AVAILABLE = "55P03"


def lock_function(lifetime: Lifetime, *, wait: bool, shared: bool) -> str:
    """The name of the advisory-lock function for these choices (the article's table)."""
    return (
        "pg_"
        + ("" if wait else "try_")
        + "advisory_"
        + ("xact_" if lifetime == "xact" else "")
        + "lock"
        + ("_shared" if shared else "")
    )


def acquire(key: Key, lifetime: Lifetime, *, wait: bool, shared: bool) -> str:
    return f"SELECT {lock_function(lifetime, wait=wait, shared=shared)}({key.sql_args})"


def unlock(key: Key, *, shared: bool) -> str:
    return f"SELECT pg_advisory_unlock{'_shared' if shared else ''}({key.sql_args})"


def set_local_lock_timeout(milliseconds: int) -> str:
    if isinstance(milliseconds, bool) or not isinstance(milliseconds, int) or milliseconds < 1:
        raise ValueError(f"lock_timeout must be a positive number of ms, got {milliseconds!r}")
    return f"SET LOCAL lock_timeout = '{milliseconds}ms'"


def held_here(key: Key, *, shared: bool) -> str:
    """Whether this backend holds ``key`` granted, according to ``pg_locks``."""
    classid, objid, objsubid = encode_pg_lock(key)
    mode = "ShareLock" if shared else "ExclusiveLock"
    return (
        "SELECT EXISTS (SELECT 1 FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        f" AND classid = {classid} AND objid = {objid} AND objsubid = {objsubid}"
        f" AND mode = '{mode}')"
    )
