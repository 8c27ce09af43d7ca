"""The SQLAlchemy adapter of an async connection or session; see
:mod:`pgsolo.drivers._sqlalchemy`."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, ClassVar, cast

from ..._acompat import AIS_ASYNC, AEvent, ato_its_end
from ..._logging import drivers_logger as logger
from ...errors import ConnectionStateError
from .. import AsyncDriver, AsyncHeartbeat, Edge, Lacking, News, heartbeat_of
from .._sqlalchemy import (
    SESSION_LOCK_REFUSAL,
    AsyncConnection,
    AsyncSession,
    Connection,
    SqlAlchemyBase,
    aautocommitting,
    acore_of,
    as_async,
    astart_driver_transaction,
    driver_connection_of,
)

__all__ = ["AsyncSqlAlchemyDriver"]

# COMMIT and ROLLBACK wait for no lock: a server that has not answered by then is not.
_END_WITHIN = 5.0


class AsyncSqlAlchemyDriver(SqlAlchemyBase):
    """pgsolo's driver protocol (:class:`~pgsolo.drivers.AsyncDriver`) on a SQLAlchemy
    ``AsyncConnection`` or ``AsyncSession``: the statements go through pgsolo's adapter of
    the driver connection under it, the transaction's edges through SQLAlchemy."""

    is_async: ClassVar[bool] = AIS_ASYNC
    lone_calls: ClassVar[None] = None  # every round trip is fetch_value's
    _owner: AsyncConnection | AsyncSession

    def __init__(self, owner: AsyncConnection | AsyncSession) -> None:
        self._setup(owner, acore_of(owner))

    @property
    def transaction_hint(self) -> str:
        if isinstance(self._core, Connection):
            if self._sqlalchemy_autocommit():  # where conn.begin() opens none at the server
                return (
                    'await conn.execution_options(isolation_level="READ COMMITTED")`, then'
                    " `async with conn.begin():"
                )
            return "async with conn.begin():"
        return "async with session.begin():"

    @property
    def ending_advice(self) -> str:
        if isinstance(self._core, Connection):
            return (
                "commit or roll it back first (await conn.commit() / await conn.rollback()),"
                " or call it outside `async with conn.begin():`"
            )
        return (
            "commit or roll it back first (await session.commit() / await"
            " session.rollback()), or call it outside `async with session.begin():`"
        )

    @property
    def session_locks_refused(self) -> str | None:
        if isinstance(self._core, Connection):
            return None
        return SESSION_LOCK_REFUSAL + ": `async with engine.connect() as conn:`, then pass `conn`"

    async def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        if edge is not None and edge != "begin":
            return await self._end(statements, wait, edge)
        if edge == "begin":
            # Under AUTOCOMMIT SQLAlchemy's transaction opens none at the server, and one it
            # began already (autobegun) refuses a second begin(): pgsolo's goes to the
            # driver connection alone, and SQLAlchemy's books stay as the caller left them.
            self._books_left = self._owner.in_transaction() and self._sqlalchemy_autocommit()
            if not self._books_left:
                self._trans = await self._owner.begin()
        inner, conn = await self._bound()
        try:
            return await self._send(inner, conn, statements, wait, edge)
        except BaseException:  # whatever ended it: an interruption can leave it closed too
            await self._invalidate_if_dead(inner)
            raise

    async def _send(
        self,
        inner: AsyncDriver,
        conn: Connection,
        statements: Sequence[str],
        wait: float,
        edge: Edge | None,
    ) -> object:
        if self._sqlalchemy_autocommit():
            # No transaction at the server whatever SQLAlchemy's books say: a bare one.
            return await inner.fetch_value(statements, wait, edge)
        if conn.in_transaction():
            await astart_driver_transaction(conn)
            return await inner.fetch_value(statements, wait)
        async with aautocommitting(conn, inner):
            return await inner.fetch_value(statements, wait)

    async def _invalidate_if_dead(self, inner: AsyncDriver) -> None:
        """A driver connection found dead under pgsolo's statement is invalidated, as
        SQLAlchemy does when one of its own statements finds it so: its pool discards it
        rather than reset it (which would fail, and log an ERROR with a traceback), and
        the caller's next use of it says it was invalidated."""
        owner = self._owner
        if not inner.is_closed():
            return
        if isinstance(owner, AsyncConnection):
            conn = owner
        elif owner.in_transaction():
            conn = await owner.connection()
        else:  # a Session's connection went back to the pool with its transaction
            return
        try:
            await conn.invalidate()
        except Exception as exc:  # the caller's error says what happened; this is extra
            logger.debug("pgsolo: invalidating a dead SQLAlchemy connection failed: %r", exc)

    async def _bound(self) -> tuple[AsyncDriver, Connection]:
        """pgsolo's adapter of the driver connection serving the caller's object now, and
        SQLAlchemy's connection over it."""
        core = self._core
        if isinstance(core, Connection):
            return as_async(self._bound_inner()), core
        if not core.in_transaction():
            raise ConnectionStateError(
                "pgsolo's statements on an ORM session need its transaction open (the"
                " session has no connection outside one): `async with session.begin():`"
            )
        conn = acore_of(await cast(AsyncSession, self._owner).connection())
        if not isinstance(conn, Connection):
            raise ConnectionStateError("the session gave no connection")
        if self._inner is None or self._inner_of is not core.get_transaction():
            self._inner = self._adapt_driver(driver_connection_of(conn))
            self._inner_of = core.get_transaction()
        return as_async(self._inner), conn

    async def _end(self, statements: Sequence[str], wait: float, edge: Edge) -> object:
        """Send the last statements of pgsolo's own transaction, then end it through
        SQLAlchemy, exactly once, whatever happens (also when the connection died: the
        transaction object must not stay open on SQLAlchemy's books)."""
        trans, self._trans = self._trans, None
        if self._books_left:  # SQLAlchemy's transaction is the caller's: not pgsolo's to end
            self._books_left = False
            return await self._last_statements(statements, wait, edge)
        try:
            value = await self._last_statements(statements, wait, edge)
        except BaseException:
            await self._quietly_end(trans, "rollback")
            raise
        try:
            await self._quietly_end(trans, edge, quiet=False)
        except BaseException:
            await self._quietly_end(trans, "rollback")
            raise
        return value

    async def _last_statements(self, statements: Sequence[str], wait: float, edge: Edge) -> object:
        if not statements and not self._sqlalchemy_autocommit():
            return None
        inner, _ = await self._bound()
        try:
            if self._sqlalchemy_autocommit():
                return await inner.fetch_value(statements, wait, edge)
            return await inner.fetch_value(statements, wait)
        except Exception:
            await self._invalidate_if_dead(inner)
            raise

    async def _quietly_end(self, trans: Any, edge: Edge, *, quiet: bool = True) -> None:
        """Commit or roll back ``trans`` if it is still open; if the work ended it and
        SQLAlchemy began another meanwhile (autobegin), end that one, as a bare
        connection's COMMIT would."""
        target: Any = None
        if trans is not None and trans.is_active:
            target = trans
        elif self._owner.in_transaction():
            target = self._owner
        if target is None:
            return
        # To its end, though cancelled meanwhile: cut, SQLAlchemy would discard the
        # connection, and its backend would hold the lock after the caller went on.
        if not quiet:
            ending = target.commit() if edge == "commit" else target.rollback()
            await ato_its_end(ending, _END_WITHIN)
            return
        with contextlib.suppress(Exception):
            await ato_its_end(target.rollback(), _END_WITHIN)

    async def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        return await as_async(self._bound_inner()).fetch_value_elsewhere(statements)

    def heartbeat(self) -> AsyncHeartbeat | Lacking:
        # The driver connection under SQLAlchemy's decides (none yet: a Session's).
        inner = self._current()
        found = None if inner is None else as_async(inner).heartbeat()
        return found if isinstance(found, Lacking) else self

    async def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None:
        inner = self._current()
        if inner is None or self._core.in_transaction():
            return None
        return await heartbeat_of(as_async(inner).heartbeat()).beat(statement, answer_within)

    async def wait_for_news(self, seconds: float, stopping: AEvent) -> News:
        # No check of SQLAlchemy's transaction, unlike a beat (which would run in it): reading
        # runs no statement, and the driver under it decides by the connection itself.
        inner = self._current()
        if inner is None:
            await stopping.wait(seconds)  # no driver connection to watch until the beat
            return "quiet"
        return await heartbeat_of(as_async(inner).heartbeat()).wait_for_news(seconds, stopping)
