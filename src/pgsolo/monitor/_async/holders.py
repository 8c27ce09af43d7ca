"""Is a key held, and by whom: :func:`is_locked_async` and :func:`lock_holders_async`.

One read of ``pg_locks`` with each holder's ``pg_stat_activity`` row (the query of
:func:`~pgsolo.advisory_locks`, for one key), outside any transaction of the caller's:
it takes no lock and leaves the connection as it found it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...drivers import adapt_async
from ...keys import KeyLike, Registry
from ...locking import adrive
from ..locks import AdvisoryLock, holders_query

if TYPE_CHECKING:
    from ...drivers.kinds import AsyncConnectionLike

__all__ = ["is_locked_async", "lock_holders_async"]


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
    holders (:func:`~pgsolo.advisory_locks` lists them).

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
