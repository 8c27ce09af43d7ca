"""Who holds which lock: :func:`advisory_locks_async` (every advisory lock of the
database), and for one key :func:`lock_holders_async` and :func:`is_locked_async`.

One read of ``pg_locks`` with each session's ``pg_stat_activity`` row (the query of
:class:`~pgsolo.monitor.locks.LocksQuery`), outside any transaction of the caller's: it
takes no lock and leaves the connection as it found it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ...drivers import adapt_async
from ...keys import KeyLike, Registry
from ...locking import adrive
from ..locks import AdvisoryLock, LocksQuery, holders_query

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["advisory_locks_async", "is_locked_async", "lock_holders_async"]


async def advisory_locks_async(
    conn: AsyncConnectionLike,
    *,
    registry: Registry | None = None,
    names: Iterable[str] = (),
    key: KeyLike | None = None,
    pid: int | None = None,
    from_ledger: bool = False,
    semaphores: Mapping[str, int] | None = None,
) -> list[AdvisoryLock]:
    """Every advisory lock of the connection's database, held and waiting, in one round
    trip: grouped by key, holders first, waiters in the order they started waiting.

    ``registry`` and ``names`` name the keys; ``key`` and ``pid`` keep only that key's
    or that backend's rows; ``from_ledger`` names what is left from pgsolo's ledger, in
    a second round trip when the ledger exists and a held key is still unnamed.
    ``semaphores`` (``{"exports": 3}``: a :func:`~pgsolo.semaphore`'s name and limit)
    tells which keys are slots of which semaphore (:attr:`AdvisoryLock.semaphore`, which
    :func:`~pgsolo.semaphore_uses` groups), besides those the holders' sessions tell. Bad
    arguments raise before any SQL is sent.
    """
    query = LocksQuery.of(registry, names, key, pid, from_ledger, semaphores)
    driver = adapt_async(conn)
    return await adrive(query.plan(driver), driver)


async def lock_holders_async(
    conn: AsyncConnectionLike,
    key: KeyLike,
    *,
    namespace: int | None = None,
    registry: Registry | None = None,
) -> list[AdvisoryLock]:
    """Who holds ``key`` right now, through an async connection: one
    :class:`~pgsolo.AdvisoryLock` per holder (its ``pid``, ``application_name``,
    ``client_addr``, ``since``, ``query``...), none when the key is free. Several for a
    shared lock; the connection's own session counts as any other. Waiters are not
    holders (:func:`advisory_locks_async` lists them).

    ``key``, ``namespace`` and ``registry`` are as for the lock calls; a bad key raises
    before any SQL is sent. What the server hides of another role's session (without
    ``pg_read_all_stats``) is ``None``; the holder is still counted.
    """
    query = holders_query(key, namespace, registry)
    driver = adapt_async(conn)
    return await adrive(query.holders_plan(driver), driver)


async def is_locked_async(
    conn: AsyncConnectionLike,
    key: KeyLike,
    *,
    namespace: int | None = None,
    registry: Registry | None = None,
) -> bool:
    """Whether any session (this one included) holds ``key`` right now, through an async
    connection. A snapshot: the answer can change as soon as it is given, so use it to
    look, never to decide to run work (a lock call decides that)."""
    held = await lock_holders_async(conn, key, namespace=namespace, registry=registry)
    return bool(held)
