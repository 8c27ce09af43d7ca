"""The small surface pgsolo needs from a database driver.

A driver adapter wraps one connection of some library (psycopg 3, psycopg2, asyncpg, or
a framework's connection: SQLAlchemy, Django) and offers:

- ``fetch_value(statements, wait, edge)``: send statements in as few round trips as the
  library allows (one where it takes several statements in one message), and return the
  first value of the last statement that returned a row; with ``edge``, open the
  transaction pgsolo owns before them or end it after them, the way the library or the
  framework that owns the connection's transactions does it;
- ``transaction_status()``, ``backend_pid()``, ``begins_implicitly`` and
  ``server_info()``: what the connection looks like now, without a round trip; and
  ``idle_pid()``, the backend pid if the connection is open with no transaction, the
  common case a session lock asks about before it is taken and given back, answered at
  once where the library can (:class:`IdleByStatus` asks the other questions);
- ``sqlstate(exc)``, ``error_detail(exc)`` and ``is_closed()``: how to read the
  driver's errors;
- ``ending_advice``: how the caller ends an open transaction, in its library's words;
- ``client_address()``: this end of the connection's socket, to compare with what the
  server sees (a proxy in between shows its own address);
- ``fetch_value_elsewhere(statements)``: the same as ``fetch_value`` on a new, short-lived
  connection to the same place (to see whether it lands on the same backend);
- on a connection pgsolo opened itself (``_psycopg.bound_answers``), a hard deadline for each
  of pgsolo's round trips, past which the connection is shut down;
- ``heartbeat()``: an optional capability, declared by the adapter's type. A driver whose
  connection a heartbeat can share with the caller's statements returns its
  :class:`SyncHeartbeat` (or :class:`AsyncHeartbeat`): ``beat(statement, timeout)``, one
  heartbeat for the keeper, sent only when nobody is using the connection and no
  transaction is open on it, with a hard deadline; and ``wait_for_news(seconds,
  stopping)``, what the keeper does between beats: wait for the connection's socket to
  turn readable and, when nobody is using the connection, read what came (a server that
  terminates the backend says so and closes the socket at once). A driver that cannot
  returns :class:`Lacking`, which says why, and ``keep=`` is refused with a
  :class:`~pgsolo.UsageError` before any SQL, on every driver alike.

The lock logic in :mod:`pgsolo.locking` is written once against these protocols and driven
by a sync or an async shell, so the two never drift. mypy checks each adapter against
them where its module's ``adapt`` returns it (and its ``heartbeat`` returns itself): no
cast. Which libraries there are, and what pgsolo derives from each, is
:mod:`pgsolo.drivers.registry`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING, ClassVar, Literal, Protocol, TypeVar, cast

from .. import sql
from .._acompat import AEvent, Event
from ..errors import UnsupportedConnectionError, UsageError
from .registry import LIBRARIES, Library

if TYPE_CHECKING:
    # Type checkers know typing_extensions: no runtime dependency for an annotation.
    from typing_extensions import TypeIs

    from .kinds import SyncConnectionLike

__all__ = [
    "REQUEST_END_HOOKS",
    "UNKNOWN_SERVER",
    "AsyncDriver",
    "AsyncHeartbeat",
    "AsyncLoneCalls",
    "BeatFailed",
    "DriverBase",
    "Edge",
    "IdleByStatus",
    "Lacking",
    "News",
    "Rows",
    "ServerInfo",
    "SyncDriver",
    "SyncHeartbeat",
    "SyncLoneCalls",
    "TxStatus",
    "adapt",
    "adapt_async",
    "adapt_sync",
    "as_sync",
    "django_command_error",
    "django_configured",
    "django_connection",
    "driver_errors",
    "edged",
    "heartbeat_of",
    "is_async",
    "is_unavailable",
]


Edge = Literal["begin", "commit", "rollback"]
"""An edge of the transaction pgsolo owns (see :class:`~pgsolo.locking.plans.Own`)."""


News = Literal["quiet", "read", "busy"]
"""What :meth:`SyncHeartbeat.wait_for_news` saw: nothing until the time was up or the keeper
stopped (``quiet``); input on the idle connection, read and handed on (``read``:
notifications, notices, parameter changes); input while the caller is using the
connection, left to the caller (``busy``). A connection found gone raises
:class:`BeatFailed`."""


class TxStatus:
    """A connection's transaction status, as every driver reports it: five fixed
    instances, compared by identity, as an Enum's members are. Not an Enum: on Python
    3.11 looking a member up in one costs 55 ns (the ``__getattr__`` of Enum's metaclass
    slows every attribute of the class) against 13 here, and every lock looks up about
    ten."""

    __slots__ = ("name", "words")

    IDLE: ClassVar[TxStatus]  # no transaction open
    ACTIVE: ClassVar[TxStatus]  # a statement is running right now
    INTRANS: ClassVar[TxStatus]  # inside a transaction block
    INERROR: ClassVar[TxStatus]  # inside a failed transaction block: only ROLLBACK works
    UNKNOWN: ClassVar[TxStatus]  # the connection is broken or closed

    def __init__(self, name: str, words: str) -> None:
        self.name = name
        self.words = words  # the status as an error message says it (never libpq's word)

    def __repr__(self) -> str:
        return f"TxStatus.{self.name}"


TxStatus.IDLE = TxStatus("IDLE", "no transaction is open")
TxStatus.ACTIVE = TxStatus("ACTIVE", "it is running another statement")
TxStatus.INTRANS = TxStatus("INTRANS", "a transaction is open")
TxStatus.INERROR = TxStatus("INERROR", "its transaction has failed")
TxStatus.UNKNOWN = TxStatus("UNKNOWN", "it is closed or broken")


@dataclass(frozen=True, slots=True)
class ServerInfo:
    """Who we are talking to, for logs and errors. Never carries a password."""

    database: str
    host: str
    port: int | None
    user: str
    application_name: str

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}" if self.port is not None else self.host


# What a driver says of a connection it never saw open (logs and errors of a lock taken
# on an already closed one): one shared value, not a new one made with every driver.
UNKNOWN_SERVER = ServerInfo(database="?", host="?", port=None, user="?", application_name="")


class BeatFailed(Exception):
    """A heartbeat could not be sent or got no answer: the connection is gone, or (with
    ``unresponsive``) the server did not answer in time and the connection was shut
    down so that nothing else waits on it forever."""

    def __init__(self, message: str, *, unresponsive: bool = False) -> None:
        super().__init__(message)
        self.unresponsive = unresponsive


class DriverBase(Protocol):
    is_async: ClassVar[bool]
    """True for drivers whose ``fetch_value`` is a coroutine function."""

    ends_by_message: ClassVar[bool]
    """True when pgsolo's own transaction ends by a COMMIT or ROLLBACK sent in the same
    message as its last statements (a bare connection, :func:`edged`): if one of those
    fails, the transaction stays open, failed. False where a framework's API ends it
    (Django, SQLAlchemy), which rolls it back then."""

    @property
    def connection(self) -> object:
        """The wrapped connection object (what pgsolo tracks held session locks by)."""

    @property
    def begins_implicitly(self) -> bool:
        """True when the driver opens a transaction by itself before a statement
        (psycopg with ``autocommit=False``): the caller is in that transaction even
        before its first statement, so a transaction lock joins it."""

    def transaction_status(self) -> TxStatus: ...

    def backend_pid(self) -> int: ...

    def idle_pid(self) -> int | None:
        """The backend pid if the connection is open with no transaction open (and, where
        the driver can tell, no statement running); None otherwise, when the caller asks
        :meth:`transaction_status` why. What every lock asks before it takes and gives
        back a session lock: one call, where the driver can answer it at once."""

    def server_info(self) -> ServerInfo: ...

    def heartbeat(self) -> SyncHeartbeat | AsyncHeartbeat | Lacking:
        """The keeper's capability, or why there is none (:class:`SyncDriver` and
        :class:`AsyncDriver` say which flavour)."""

    @property
    def session_locks_refused(self) -> str | None:
        """Why this connection takes no session lock (it may change under the lock, as an
        ORM Session's does), or None."""

    @property
    def transaction_hint(self) -> str:
        """How the caller opens a transaction on this connection, in its library's or
        framework's words (``with transaction.atomic():`` on Django), for an error that
        asks for one."""

    @property
    def ending_advice(self) -> str:
        """How the caller ends or leaves the transaction open on this connection, in its
        library's words: for a call refused because it must own the transaction."""

    def sqlstate(self, exc: BaseException) -> str | None: ...

    def is_closed(self) -> bool: ...

    def error_detail(self, exc: BaseException) -> str | None: ...

    def scrub(self, text: str) -> str:
        """``text`` (say, an error to store) with this connection's own password blanked
        out."""

    def client_address(self) -> tuple[str, int] | None:
        """(address, port) of this end of a TCP connection; None for a unix socket."""


@dataclass(frozen=True, slots=True)
class Lacking:
    """A capability a driver does not have, and why (the refusal says it)."""

    why: str


class SyncHeartbeat(Protocol):
    """The keeper's capability: a heartbeat that can share the connection with the
    caller's statements, and a socket to watch between beats."""

    def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None:
        """The first row of ``statement`` as text, or None if the connection was in use
        (a statement running, or a transaction open). Raises :class:`BeatFailed`."""

    def wait_for_news(self, seconds: float, stopping: Event) -> News:
        """Wait up to ``seconds`` (less once ``stopping`` is set) for the server to send
        something on the connection; read it if nobody is using the connection (its
        notifications stay for the caller). Raises :class:`BeatFailed` if the connection
        turns out gone."""


class AsyncHeartbeat(Protocol):
    async def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None: ...

    async def wait_for_news(self, seconds: float, stopping: AEvent) -> News: ...


Rows = Sequence[Sequence[object]]


class SyncLoneCalls(Protocol):
    """A driver's own way to send a lock call alone (a session lock's try, or its
    unlock: most of pgsolo's round trips), cheaper than its ``fetch_value``
    (:attr:`SyncDriver.lone_calls`); :class:`AsyncLoneCalls` says what each call does."""

    def send(self, statements: Sequence[str]) -> Rows | None: ...

    def resend(self, failure: Exception, statements: Sequence[str]) -> object: ...


class SyncDriver(DriverBase, Protocol):
    def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        """``wait``: seconds the statements may wait for a lock on the server (bounded
        there by ``lock_timeout``), on top of the deadline of a connection pgsolo opened
        (``_psycopg.bound_answers``). ``edge``: open pgsolo's own transaction before the
        statements, or commit or roll it back after them (:func:`edged` on a bare
        connection)."""

    def fetch_value_elsewhere(self, statements: Sequence[str]) -> object: ...

    @property
    def lone_calls(self) -> SyncLoneCalls | None:
        """The driver's own way to send a lock call alone, where it has a cheaper one
        than :meth:`fetch_value`'s; None (every sync driver's, so far) where every round
        trip is ``fetch_value``'s."""

    def heartbeat(self) -> SyncHeartbeat | Lacking:
        """The heartbeat a keeper watches a lock on this connection with, or why there
        is none."""


class AsyncLoneCalls(Protocol):
    """A driver's own way to send a lock call alone (a session lock's try, or its
    unlock: most of pgsolo's round trips), awaited by the lock itself, with no coroutine
    of pgsolo's between it and the server (:attr:`AsyncDriver.lone_calls`)."""

    def send(self, statements: Sequence[str]) -> Awaitable[Rows] | None:
        """The round trip of ``statements``, if they are one lock call this way sends, on
        a connection whose :meth:`~DriverBase.idle_pid` answered just now, with nothing
        awaited since: the awaitable of its rows (one row, of the call's value). None:
        ``fetch_value`` sends them."""

    async def resend(self, failure: Exception, statements: Sequence[str]) -> object:
        """The value of ``statements`` after :meth:`send`'s round trip raised ``failure``:
        sent again by ``fetch_value``'s way if the failure says that nothing ran (the
        caller dropped the session's prepared statements), else ``failure`` raised."""


class AsyncDriver(DriverBase, Protocol):
    async def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object: ...

    @property
    def lone_calls(self) -> AsyncLoneCalls | None:
        """The driver's own way to send a lock call alone, where it has a cheaper one
        than :meth:`fetch_value`'s (asyncpg's prepared statements, run by its protocol);
        None where every round trip is ``fetch_value``'s."""

    async def fetch_value_elsewhere(self, statements: Sequence[str]) -> object: ...

    def heartbeat(self) -> AsyncHeartbeat | Lacking: ...


_Beating = TypeVar("_Beating")


def heartbeat_of(found: _Beating | Lacking) -> _Beating:
    """The heartbeat a driver's ``heartbeat()`` found, or the one refusal of ``keep=``
    every driver gives (before any SQL)."""
    if isinstance(found, Lacking):
        raise UsageError(f"keep= cannot watch a lock on this connection: {found.why}")
    return found


def edged(statements: Sequence[str], edge: Edge | None, driver: DriverBase) -> list[str]:
    """``statements`` with the edge of pgsolo's own transaction as statements of the same
    message, for a bare connection (one no framework keeps books on) of ``driver``, asked
    whether it begins by itself only for a BEGIN (on psycopg, a property that reads
    another: every transaction lock's COMMIT would pay for it)."""
    if edge == "begin":
        return list(statements) if driver.begins_implicitly else [sql.BEGIN, *statements]
    if edge is not None:
        return [*statements, sql.COMMIT if edge == "commit" else sql.ROLLBACK]
    return list(statements)


SUPPORTED_CONNECTIONS = ", ".join(library.takes for library in LIBRARIES)

_LIBRARIES = {library.package: library for library in LIBRARIES}

Adapter = Callable[[object], "SyncDriver | AsyncDriver | None"]


@functools.cache
def _adapter_for(package: str) -> Adapter | None:
    """The ``adapt`` of pgsolo's module for ``package``'s connections, imported once (every
    lock looks it up), and only when one of them arrives: importing pgsolo never imports
    a driver the user did not install."""
    adapter = _ADAPTERS.get(package)
    if adapter is None:
        library = _LIBRARIES.get(package)
        if library is None:
            return None
        adapter = _ADAPTERS[package] = import_module(library.adapter, __name__).adapt
    return adapter


# The ``adapt`` of each package seen so far: import_module runs importlib's Python on
# every call, even for a module already imported.
_ADAPTERS: dict[str, Adapter] = {}
# The same by the connection's type, which every lock looks up first: one dict lookup,
# where its package's name costs an attribute, a split and a cached call. Emptied when
# full, so that types made on the fly (a subclass per test) are not kept forever.
_BY_TYPE: dict[type, Adapter] = {}
_BY_TYPE_MAX = 64


def adapt(connection: object) -> SyncDriver | AsyncDriver:
    """The adapter for ``connection``, chosen by its type. Anything else raises
    :class:`~pgsolo.UnsupportedConnectionError` naming what is supported."""
    adapter = _BY_TYPE.get(type(connection))
    if adapter is None:
        adapter = _adapter_for(type(connection).__module__.partition(".")[0])
        if adapter is not None:
            if len(_BY_TYPE) >= _BY_TYPE_MAX:
                _BY_TYPE.clear()
            _BY_TYPE[type(connection)] = adapter
    driver = adapter(connection) if adapter is not None else None
    if driver is None:
        raise UnsupportedConnectionError(
            f"pgsolo takes {SUPPORTED_CONNECTIONS}; got {_name_of(connection)}"
            f"{_hint_for(connection)}"
        )
    return driver


def _hint_for(connection: object) -> str:
    """What to pass instead, for the two mistakes a new user makes most: a DSN where a
    connection goes, and a psycopg pool (a lock belongs to one session)."""
    if isinstance(connection, str | bytes):
        return (
            " (a DSN is not a connection: open one, psycopg.connect(dsn, autocommit=True),"
            " or give the DSN to run_job, @singleton or `pgsolo run`, which connect themselves)"
        )
    if type(connection).__module__.partition(".")[0] == "psycopg_pool":
        return (
            " (a pool is not a connection: a lock belongs to one session, so pass one of its"
            " connections, `with pool.connection() as conn:`)"
        )
    return ""


def driver_errors() -> tuple[type[Exception], ...]:
    """The exception classes of the drivers pgsolo adapts (:mod:`.registry`): what a
    statement on a connection raises when the server refuses it or the connection fails.
    Another library's count only once it is imported (a connection of it can exist only
    then): pgsolo never imports it."""
    return tuple(kind for library in LIBRARIES for kind in _classes(library, library.errors))


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (a driver's error) says the server cannot be reached or the
    connection failed, rather than that a statement was refused."""
    unavailable = [c for library in LIBRARIES for c in _classes(library, library.unavailable)]
    return isinstance(exc, tuple(unavailable))


def _classes(library: Library, names: Sequence[str]) -> list[type[Exception]]:
    """The classes ``names`` of ``library``, those of a module already imported (pgsolo's
    own dependency is imported here)."""
    found: list[type[Exception]] = []
    for name in names:
        module_name, _, attribute = name.rpartition(".")
        module = import_module(module_name) if library.required else sys.modules.get(module_name)
        if module is not None:
            found.append(getattr(module, attribute))
    return found


# Called with a framework's connection at the end of a unit of work (a Django request):
# pgsolo.locking registers what releases the session locks still held on it. Here, so
# that a framework's adapter (drivers/) needs nothing from the layer above it.
REQUEST_END_HOOKS: list[Callable[[SyncDriver], None]] = []


def django_configured() -> bool:
    """Whether this process has configured Django's settings, found without importing
    Django: a process that uses Django has imported it long before it asks."""
    conf = sys.modules.get("django.conf")
    return conf is not None and bool(conf.settings.configured)


def django_connection(alias: str) -> SyncConnectionLike:
    """Django's ``connections[alias]`` (``using=``), or a :class:`~pgsolo.UsageError`
    before any SQL: an alias Django does not have, or no Django at all."""
    connection: SyncConnectionLike = _django_module("using=").connection_of(alias)
    return connection


def django_command_error(message: str, returncode: int) -> Exception:
    """Django's ``CommandError`` with ``returncode``, the exit code of ``manage.py``."""
    error: Exception = _django_module("a management command's job").command_error(
        message, returncode
    )
    return error


def _django_module(needed_by: str) -> ModuleType:
    """pgsolo's Django module, imported when first needed: ``needed_by`` says what asked for
    it, when Django is not installed."""
    try:
        return import_module("._django", __name__)
    except ImportError as exc:
        raise UsageError(
            f"{needed_by} needs Django, which cannot be imported ({exc}): pip install"
            " 'pgsolo[django]'"
        ) from exc


class _Connected(Protocol):
    def is_closed(self) -> bool: ...
    def transaction_status(self) -> TxStatus: ...
    def backend_pid(self) -> int: ...


class IdleByStatus:
    """:meth:`DriverBase.idle_pid` for a driver that answers it with its other calls
    (Django's and SQLAlchemy's, whose answers depend on the framework's own state)."""

    def idle_pid(self: _Connected) -> int | None:
        if self.is_closed() or self.transaction_status() is not TxStatus.IDLE:
            return None
        return self.backend_pid()


def is_async(driver: SyncDriver | AsyncDriver) -> TypeIs[AsyncDriver]:
    return driver.is_async


def as_sync(driver: SyncDriver | AsyncDriver) -> SyncDriver:
    """``driver`` as a sync one, where :func:`is_async` was not asked (the sync twin of
    code written for async drivers)."""
    return cast(SyncDriver, driver)


def adapt_sync(connection: object) -> SyncDriver:
    driver = adapt(connection)
    if is_async(driver):
        raise UnsupportedConnectionError(
            f"this call takes a sync connection, and {_name_of(connection)} is async: use the"
            " call's async variant where it has one (xact_lock and session_lock take both;"
            " run_job_async, run_once_async, leader_async, advisory_locks_async)"
        )
    return driver


def adapt_async(connection: object) -> AsyncDriver:
    driver = adapt(connection)
    if not is_async(driver):
        raise UnsupportedConnectionError(
            f"this call takes an async connection, and {_name_of(connection)} is sync: use"
            " the sync variant (run_job, run_once, leader, advisory_locks)"
        )
    return driver


def _name_of(connection: object) -> str:
    kind = type(connection)
    return f"{kind.__module__}.{kind.__qualname__}"
