"""SQLAlchemy: a ``Connection``, ``AsyncConnection``, ``orm.Session`` or ``AsyncSession``
on the psycopg, psycopg2 or asyncpg dialect.

pgsolo's statements go to the driver connection under SQLAlchemy's (a ``psycopg``,
``psycopg2`` or ``asyncpg`` connection) through pgsolo's own adapter of that library; what
SQLAlchemy keeps books on is done through SQLAlchemy:

- the transaction state is SQLAlchemy's (``in_transaction()``), so a transaction lock
  joins the transaction the caller believes they are in, and ``with xact_lock(conn)``
  outside one opens pgsolo's own with ``conn.begin()`` / ``session.begin()`` and ends it
  with that transaction object's ``commit()`` / ``rollback()``;
- outside SQLAlchemy's transaction the dialects run the driver connection with
  ``autocommit=False`` (the driver would open a transaction SQLAlchemy knows nothing of):
  pgsolo's statements then run with the driver's autocommit switched on for their round
  trip (no round trip of its own), so nothing is left open behind SQLAlchemy's back;
- with asyncpg, SQLAlchemy starts its asyncpg ``Transaction`` lazily, at its first
  statement: inside SQLAlchemy's transaction it is started before pgsolo's statements, so
  that they run in it and asyncpg's books stay true (to its end, also when the caller is
  cancelled meanwhile: see :func:`astart_driver_transaction`);
- a connection SQLAlchemy runs in ``AUTOCOMMIT`` has no transaction at the server whatever
  SQLAlchemy's books say: pgsolo treats its driver connection as a bare one.

The adapters are one source, :class:`AsyncSqlAlchemyDriver`
(``_async/sqlalchemy_driver.py``), and its generated twin :class:`SqlAlchemyDriver`.
:func:`listen_for_returns` is the pool hook's SQLAlchemy side
(:func:`pgsolo.sqlalchemy.install`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.util import await_only  # await_ from 2.1 on; this name until 2.2

from .._acompat import afinished
from ..errors import ConnectionStateError, UnsupportedConnectionError
from . import AsyncDriver, IdleByStatus, ServerInfo, SyncDriver, TxStatus, as_sync, is_async
from . import _sqlalchemy_private as private

__all__ = [
    "SESSION_LOCK_REFUSAL",
    "AsyncConnection",
    "AsyncSession",
    "Connection",
    "Session",
    "SqlAlchemyBase",
    "aautocommitting",
    "acore_of",
    "as_async",
    "as_sync",
    "astart_driver_transaction",
    "autocommitting",
    "core_of",
    "driver_connection_of",
    "listen_for_returns",
    "start_driver_transaction",
]

SESSION_LOCK_REFUSAL = (
    "a session lock (session_lock, run_job with lifetime='session', and run_once, which"
    " holds one across the commits it makes) needs a connection that lives as long as the"
    " lock, and an ORM Session hands its connection back to the pool whenever its"
    " transaction ends (the unlock would reach another server session); use an Engine"
    " connection instead"
)
"""Why an ORM Session takes no session lock; each flavour's driver adds the way out."""


class SqlAlchemyBase(IdleByStatus):
    """What both adapters do the same: everything but the round trips.

    ``_owner`` is what the caller passed; ``_core`` its sync core (the ``Connection`` or
    ``Session`` an async one drives). A ``Connection``'s driver connection is the same
    for the lock's life and is bound at once; a ``Session`` finds its connection anew in
    each of its transactions, so it is bound at the first statement of each."""

    _owner: Any
    _core: Connection | Session
    _inner: SyncDriver | AsyncDriver | None
    _inner_of: object  # the Session transaction _inner was bound in
    # SQLAlchemy ends pgsolo's own transaction, and rolls it back when the statements
    # before its end fail.
    ends_by_message: ClassVar[bool] = False

    def _setup(self, owner: Any, core: Connection | Session | None) -> None:
        if core is None:
            raise ConnectionStateError(
                "this AsyncConnection was not started: use `async with engine.connect() as"
                " conn:` (or `conn = await engine.connect()`)"
            )
        self._owner = owner
        self._core = core
        self._inner = None
        self._inner_of = None
        self._trans: Any = None  # the transaction pgsolo opened through SQLAlchemy
        # pgsolo's own transaction went to the driver connection alone, SQLAlchemy's books
        # left as they were (AUTOCOMMIT with its transaction already begun: see fetch_value)
        self._books_left = False
        if isinstance(core, Connection):
            self._inner = self._adapt_driver(driver_connection_of(core))

    def _adapt_driver(self, raw: object) -> SyncDriver | AsyncDriver:
        from . import adapt as adapt_any  # noqa: PLC0415

        dialect = self._dialect()
        if dialect.name != "postgresql":
            raise UnsupportedConnectionError(
                f"pgsolo needs PostgreSQL; this SQLAlchemy connection uses the {dialect.name!r}"
                f" dialect ({dialect.name}+{dialect.driver})"
            )
        inner = adapt_any(raw)
        if is_async(inner) is not self.is_async:  # type: ignore[attr-defined]
            raise UnsupportedConnectionError(
                "a sync SQLAlchemy Connection or Session on an async driver (inside"
                " run_sync()) cannot carry pgsolo's statements: pass the AsyncConnection or"
                " AsyncSession itself"
            )
        return inner

    def _bound_inner(self) -> SyncDriver | AsyncDriver:
        """The adapter bound last (a Session's binds at its first statement)."""
        inner = self._current() or self._inner
        if inner is None:
            raise ConnectionStateError("this ORM session has not used a connection yet")
        return inner

    def _dialect(self) -> Any:
        core = self._core
        bind = core.get_bind() if isinstance(core, Session) else core
        return bind.dialect

    # - what the driver connection looks like now -

    def _current(self) -> SyncDriver | AsyncDriver | None:
        """The adapter of the driver connection now serving the caller's object, if one
        does (a Session outside a transaction has none)."""
        core = self._core
        if isinstance(core, Connection):
            return self._inner
        if core.in_transaction() and self._inner_of is core.get_transaction():
            return self._inner
        return None

    def _sqlalchemy_autocommit(self) -> bool:
        """SQLAlchemy runs this connection in AUTOCOMMIT: its transactions do nothing at
        the server, and its driver connection is pgsolo's to treat as a bare one."""
        core = self._core
        if isinstance(core, Session) or core.closed or core.invalidated:
            return False
        dbapi = core.connection.dbapi_connection
        return (
            dbapi is not None
            and bool(getattr(dbapi, "autocommit", False))
            and not is_switched(core.connection.driver_connection)
        )

    @property
    def connection(self) -> object:
        # What pgsolo tracks held locks by: a Connection's driver connection (the pool
        # hook finds them there), a Session itself (it has no connection of its own).
        inner = self._inner
        if isinstance(self._core, Connection) and inner is not None:
            return inner.connection
        return self._owner

    @property
    def begins_implicitly(self) -> bool:
        inner = self._current()
        if inner is not None and self._sqlalchemy_autocommit():
            return inner.begins_implicitly
        # SQLAlchemy's view: outside its transaction nothing is about to open one (the
        # driver's own would be unknown to it, and pgsolo's statements run in autocommit).
        return False

    def transaction_status(self) -> TxStatus:
        core = self._core
        if isinstance(core, Connection) and (core.closed or core.invalidated):
            return TxStatus.UNKNOWN
        inner = self._current()
        raw = inner.transaction_status() if inner is not None else TxStatus.IDLE
        if inner is not None and self._sqlalchemy_autocommit():
            return raw
        if raw in (TxStatus.INERROR, TxStatus.UNKNOWN, TxStatus.ACTIVE, TxStatus.INTRANS):
            return raw
        return TxStatus.INTRANS if core.in_transaction() else TxStatus.IDLE

    def backend_pid(self) -> int:
        inner = self._current() or self._inner
        return inner.backend_pid() if inner is not None else 0

    def server_info(self) -> ServerInfo:
        inner = self._current() or self._inner
        if inner is not None:
            return inner.server_info()
        url = self._dialect_url()
        return ServerInfo(
            database=url.database or "",
            host=url.host or "",
            port=url.port,
            user=url.username or "",
            application_name="",
        )

    def _dialect_url(self) -> Any:
        core = self._core
        bind = core.get_bind() if isinstance(core, Session) else core
        return bind.engine.url

    def sqlstate(self, exc: BaseException) -> str | None:
        inner = self._current() or self._inner
        return inner.sqlstate(_unwrapped(exc)) if inner is not None else None

    def error_detail(self, exc: BaseException) -> str | None:
        inner = self._current() or self._inner
        return inner.error_detail(_unwrapped(exc)) if inner is not None else None

    def is_closed(self) -> bool:
        core = self._core
        if isinstance(core, Connection) and (core.closed or core.invalidated):
            return True
        # A Session whose transaction just ended on a dead connection is out of one and
        # has none: the connection it was using says what happened to it.
        inner = self._current() or self._inner
        if inner is None or not inner.is_closed():
            return False
        if isinstance(core, Connection):
            # Found closed without a statement of pgsolo's (asyncpg hears of a closed
            # socket by itself), so SQLAlchemy never saw it fail: its pool replaces it at
            # the next checkout, as it would after its own statement failed. A soft
            # invalidation sends nothing, so it can be made here, in sync code.
            core.connection.invalidate(soft=True)
        return True

    def scrub(self, text: str) -> str:
        inner = self._current() or self._inner
        text = inner.scrub(text) if inner is not None else text
        password = self._dialect_url().password
        return text.replace(str(password), "***") if password else text

    def client_address(self) -> tuple[str, int] | None:
        inner = self._current()
        return inner.client_address() if inner is not None else None


def _unwrapped(exc: BaseException) -> BaseException:
    """The driver's own error inside SQLAlchemy's wrapper (``DBAPIError.orig``); for
    asyncpg, under SQLAlchemy's DBAPI adaptation of it."""
    orig = getattr(exc, "orig", None)
    if isinstance(orig, BaseException):
        exc = orig
    cause = exc.__cause__
    if type(exc).__module__.startswith("sqlalchemy") and isinstance(cause, BaseException):
        return cause
    return exc


def driver_connection_of(core: Connection) -> object:
    """The driver connection under ``core``, without a round trip."""
    if core.closed:
        raise ConnectionStateError("this SQLAlchemy connection is closed")
    if core.invalidated:
        raise ConnectionStateError(
            "this SQLAlchemy connection was invalidated (its connection failed): roll it"
            " back, or use a new one"
        )
    return core.connection.driver_connection


# Driver connections whose autocommit pgsolo switched on for its statements, by id, with
# the connection itself (so that the id is not reused meanwhile). Switched back as soon as
# the connection is idle again: a round trip that failed inside pgsolo's BEGIN...COMMIT
# leaves a failed transaction, which pgsolo's recovery rolls back through this switch.
_SWITCHED: dict[int, object] = {}


def _switchable(core: Connection, inner: SyncDriver | AsyncDriver, setter: str) -> Any:
    """The driver connection to switch to autocommit for pgsolo's statements outside
    SQLAlchemy's transaction, or None: asyncpg has no switch (it runs statements in
    autocommit anyway), the connection may be in autocommit already, or a transaction may
    be open at the server (pgsolo's own failed one: it stays switched)."""
    raw = core.connection.driver_connection
    if (
        is_switched(raw)
        or not hasattr(raw, setter)
        or getattr(raw, "autocommit", True)
        or inner.transaction_status() is not TxStatus.IDLE
    ):
        return None
    _SWITCHED[id(raw)] = raw
    return raw


def _to_switch_back(core: Connection, inner: SyncDriver | AsyncDriver) -> Any:
    """The driver connection to switch back now (it is idle again, or gone), or None.
    It stays on the books until :func:`_switched_back` says it is switched back: cut in
    between (Ctrl-C), it would be left in autocommit with nothing left to switch it back."""
    if core.closed or core.invalidated:
        return None
    raw = core.connection.driver_connection
    if not is_switched(raw) or (
        inner.transaction_status() is not TxStatus.IDLE and not inner.is_closed()
    ):
        return None
    return raw


def _switched_back(raw: object) -> None:
    _SWITCHED.pop(id(raw), None)


def is_switched(raw: object) -> bool:
    """Whether pgsolo switched ``raw``'s autocommit on and it still is: one switched back
    whose entry a Ctrl-C left on the books is not (see :func:`_to_switch_back`)."""
    return id(raw) in _SWITCHED and bool(getattr(raw, "autocommit", False))


@contextlib.contextmanager
def autocommitting(core: Connection, inner: SyncDriver | AsyncDriver) -> Iterator[None]:
    """Run pgsolo's statements outside SQLAlchemy's transaction with the driver's
    autocommit on (psycopg, psycopg2: a flag, no round trip), so that the driver opens no
    transaction SQLAlchemy would not know of."""
    if (raw := _switchable(core, inner, "autocommit")) is not None:
        raw.autocommit = True
    try:
        yield
    finally:
        try:
            _switch_back(core, inner)
        except KeyboardInterrupt:
            _switch_back(core, inner)  # what the Ctrl-C cut short, before it goes on
            raise


def _switch_back(core: Connection, inner: SyncDriver | AsyncDriver) -> None:
    if (raw := _to_switch_back(core, inner)) is not None:
        with contextlib.suppress(Exception):  # a closed connection
            raw.autocommit = False
        _switched_back(raw)


@contextlib.asynccontextmanager
async def aautocommitting(core: Connection, inner: SyncDriver | AsyncDriver) -> AsyncIterator[None]:
    """:func:`autocommitting` for an async driver connection (psycopg's
    ``set_autocommit()``; asyncpg has nothing to switch)."""
    # Each switch is made whole even if the caller's task is cancelled meanwhile: a
    # cancelled switch back left the pool's next user in autocommit.
    raw = _switchable(core, inner, "set_autocommit")
    try:
        if raw is not None:
            await afinished(raw.set_autocommit(True))
        yield
    finally:
        if (raw := _to_switch_back(core, inner)) is not None:
            with contextlib.suppress(Exception):
                await afinished(raw.set_autocommit(False))
            _switched_back(raw)


def as_async(driver: SyncDriver | AsyncDriver) -> AsyncDriver:
    """``driver`` once it is known to be async (the twin of :func:`as_sync`)."""
    return cast(AsyncDriver, driver)


def core_of(owner: Connection | Session) -> Connection | Session:
    """The sync core of a sync object: itself (see :func:`acore_of`)."""
    return owner


def acore_of(owner: AsyncConnection | AsyncSession) -> Connection | Session | None:
    """The sync core an async object drives (None for an AsyncConnection not started)."""
    if isinstance(owner, AsyncConnection):
        return owner.sync_connection
    return owner.sync_session


def start_driver_transaction(core: Connection) -> None:
    """Nothing: a sync driver opens SQLAlchemy's transaction by itself (see
    :func:`astart_driver_transaction`)."""


async def astart_driver_transaction(core: Connection) -> None:
    """Inside SQLAlchemy's transaction on asyncpg, start the asyncpg ``Transaction`` that
    SQLAlchemy would start at its next statement, before pgsolo's statements: else they
    would run in autocommit (a transaction lock would end with its statement), and a BEGIN
    of pgsolo's would make asyncpg refuse SQLAlchemy's own transaction later. psycopg opens
    it by itself (``autocommit=False``)."""
    dbapi = core.connection.dbapi_connection
    if dbapi is not None and private.transaction_not_started(dbapi):
        await _start_to_its_end(dbapi)


# BEGIN waits for no lock: a server that has not answered it by then is not answering.
_START_WITHIN = 5.0


async def _start_to_its_end(dbapi: Any) -> None:
    """The start of SQLAlchemy's asyncpg transaction (:mod:`._sqlalchemy_private`), run to
    its end even if the caller is cancelled meanwhile; the cancellation goes on once it has
    ended.

    Cut short, the start would leave a transaction nobody ends: asyncpg takes its
    ``Transaction`` for the connection's own before it sends BEGIN and keeps it after an
    interrupted one, while SQLAlchemy's adapter records it only once BEGIN returned. Its
    rollback and its pool's reset then send nothing: the pool's next user would run in
    the transaction BEGIN opened, and asyncpg would turn its next BEGIN into a SAVEPOINT.
    (SQLAlchemy's own statements are safe: it invalidates a connection whose statement
    was cancelled.) Run to its end, the transaction is SQLAlchemy's, and the caller's
    way out rolls it back through SQLAlchemy. A connection that does not answer BEGIN in
    time is closed: its state is unknown, and SQLAlchemy treats it as a dead one."""
    start = asyncio.ensure_future(private.start_transaction(dbapi))
    try:
        await asyncio.shield(start)
    except asyncio.CancelledError:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _START_WITHIN
        while not start.done() and loop.time() < give_up:
            with contextlib.suppress(asyncio.CancelledError):  # on its way out already
                await asyncio.wait({start}, timeout=give_up - loop.time())
        if not start.done():
            dbapi.driver_connection.terminate()
        start.add_done_callback(_retrieved)  # the caller's cancellation is what propagates
        raise


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()


def _switch_back_for_good(raw: Any) -> None:
    """A connection going back to the pool with the driver's autocommit still switched on
    by pgsolo (an interruption cut both the statements and the recovery that would have
    switched it back): end the transaction pgsolo's statements left, if any, and switch it
    back, so that the pool's next user does not run in autocommit."""
    if is_switched(raw):
        with contextlib.suppress(Exception):  # a closed connection: the pool discards it
            # psycopg's set_autocommit (an awaitable on its AsyncConnection); psycopg2's flag
            switch = getattr(raw, "set_autocommit", None)
            for done in (raw.rollback(), switch(False) if switch else None):
                if inspect.isawaitable(done):
                    await_only(done)
            if switch is None:
                raw.autocommit = False
    _switched_back(raw)


def listen_for_returns(
    engine: object,
    on_return: Callable[[object], object],
    on_discard: Callable[[object], None],
) -> None:
    """Call ``on_return(driver_connection)`` before SQLAlchemy resets a connection that
    goes back to ``engine``'s pool (sync or async; an awaitable it returns is awaited in
    SQLAlchemy's greenlet); ``on_discard(driver_connection)``, which sends nothing, for
    one the pool closes instead (invalidated, or an asyncio connection the garbage
    collector found, where no event loop may be running: SQLAlchemy resets nothing then)."""
    if isinstance(engine, AsyncEngine):
        engine = engine.sync_engine
    if not isinstance(engine, Engine):
        kind = type(engine)
        raise UnsupportedConnectionError(
            f"install() takes a SQLAlchemy Engine or AsyncEngine; got {kind.__module__}."
            f"{kind.__qualname__}"
        )

    def reset(dbapi_connection: Any, record: ConnectionPoolEntry, state: Any) -> None:
        if record.driver_connection is None:
            return
        if state.terminate_only or not state.asyncio_safe:
            on_discard(record.driver_connection)  # its session, and its locks, end with it
            return
        _switch_back_for_good(record.driver_connection)
        outcome = on_return(record.driver_connection)
        if inspect.isawaitable(outcome):
            await_only(outcome)

    event.listen(engine.pool, "reset", reset)
