"""How a Locker borrows connections from a pool of the user's, whatever its library, and
gives them back (:func:`lender_of`).

psycopg_pool's pools and psycopg2's lend by ``getconn``/``putconn``, asyncpg's by
``acquire``/``release``; a SQLAlchemy ``Engine`` lends a pooled DBAPI connection through
``raw_connection()``, whose driver connection is the psycopg (or asyncpg...) connection
pgsolo adapts, and which goes back to the engine's pool when closed; an ``AsyncEngine``'s
close runs in SQLAlchemy's greenlet bridge, so it is awaited as the others' are.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

__all__ = ["Lender", "lender_of"]


@dataclass(frozen=True, slots=True)
class Lender:
    """A pool's three calls; what they return is awaited by an async Locker when it is
    awaitable."""

    borrow: Callable[[], Any]
    """A loan: a connection, or the handle that holds one (and may be awaitable)."""
    connection_of: Callable[[Any], Any]
    """The driver connection of a loan."""
    give_back: Callable[[Any], Any]
    """Return a loan to its pool."""
    is_async: bool
    """Whether it lends to async code (its loans are awaited)."""
    discard: Callable[[Any], Any] | None = None
    """Return a loan whose connection the server closed, for the pool to throw away; None
    where ``give_back`` does that already (psycopg_pool's, psycopg2's and asyncpg's pools
    look whether a connection came back closed)."""


def _same(loan: Any) -> Any:
    return loan


def lender_of(pool: object, *, is_async: bool) -> Lender:
    """How to borrow from ``pool`` for sync or async code (``is_async``), or
    :class:`~pgsolo.InvalidArgumentError` before anything is borrowed: a pool of the other
    flavour would block the event loop in each loan, or hand a thread a coroutine, and
    its connection would not be one the Locker can use."""
    lender = _lender_of(pool)
    if lender.is_async != is_async:
        have, need = ("an async", "a sync") if lender.is_async else ("a sync", "an async")
        user, other = ("an AsyncLocker", "Locker") if is_async else ("a Locker", "AsyncLocker")
        raise InvalidArgumentError(
            f"{user} needs {need} pool, got {have} one ({type(pool).__name__}): pass"
            f" {need} pool, or use {other}"
        )
    return lender


def _lender_of(pool: object) -> Lender:
    for borrow_name, give_name in (("getconn", "putconn"), ("acquire", "release")):
        borrow, give = getattr(pool, borrow_name, None), getattr(pool, give_name, None)
        if callable(borrow) and callable(give):
            # asyncpg's acquire() returns an awaitable context, not a coroutine.
            lends_async = inspect.iscoroutinefunction(borrow) or type(pool).__module__.startswith(
                "asyncpg."
            )
            return Lender(borrow, _same, give, lends_async)
    if type(pool).__module__.startswith("sqlalchemy.") and callable(
        getattr(pool, "raw_connection", None)
    ):
        return _engine_lender(pool)
    raise InvalidArgumentError(
        "a Locker needs a connection string or a connection pool (psycopg_pool's or"
        " psycopg2's getconn and putconn, asyncpg's acquire and release, or a SQLAlchemy"
        f" engine), got {type(pool).__name__}"
    )


def _engine_lender(engine: Any) -> Lender:
    from sqlalchemy.ext.asyncio import AsyncEngine  # noqa: PLC0415 - only for an engine
    from sqlalchemy.util import greenlet_spawn  # noqa: PLC0415

    def driver_connection(loan: Any) -> Any:
        return loan.driver_connection

    # A closed connection is invalidated, not closed: SQLAlchemy's reset of one sends
    # nothing on asyncpg (its pool would lend it again) and logs a traceback on psycopg.
    if isinstance(engine, AsyncEngine):
        return Lender(
            engine.raw_connection,
            driver_connection,
            lambda loan: greenlet_spawn(loan.close),
            is_async=True,
            discard=lambda loan: greenlet_spawn(loan.invalidate),
        )
    return Lender(
        engine.raw_connection,
        driver_connection,
        lambda loan: loan.close(),
        is_async=False,
        discard=lambda loan: loan.invalidate(),
    )
