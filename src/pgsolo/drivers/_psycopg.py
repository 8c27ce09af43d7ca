"""psycopg 3 adapters, sync and async.

The statements of one call go as one simple-query message: one round trip. On an
``autocommit=False`` connection with no transaction open, psycopg first sends a BEGIN
of its own and waits for it (its pipeline mode does the same, so it would gain
nothing): that is one round trip more, which is why pgsolo recommends autocommit
connections, where pgsolo sends BEGIN itself in the same message as the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import select
import socket
import time
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import psycopg
from psycopg import pq
from psycopg.conninfo import make_conninfo
from psycopg.rows import tuple_row

from ..errors import DatabaseUnavailableError
from . import BeatFailed, ServerInfo, TxStatus
from .conninfo import scrub_secrets
from .deadlines import DEADLINES, shut_down_socket

logger = logging.getLogger("pgsolo")

_SETTLE_SECONDS = 5.0
# A second, short-lived connection to the place the caller's connection goes (the proxy
# check): the caller's connection answered a moment ago, so these are generous.
PROBE_CONNECT_TIMEOUT = 10
PROBE_ANSWER_TIMEOUT = 30.0

_STATUS = {
    pq.TransactionStatus.IDLE: TxStatus.IDLE,
    pq.TransactionStatus.ACTIVE: TxStatus.ACTIVE,
    pq.TransactionStatus.INTRANS: TxStatus.INTRANS,
    pq.TransactionStatus.INERROR: TxStatus.INERROR,
    pq.TransactionStatus.UNKNOWN: TxStatus.UNKNOWN,
}


# Connections pgsolo opened itself, and how many seconds the server has to answer each
# round trip pgsolo makes on them (a lock wait's own bound comes on top). A server that
# accepts connections but never answers (a stopped process, a half-open TCP connection,
# a black-holed address) would otherwise hold pgsolo forever: past the deadline the
# socket is shut down, the driver's read fails at once, and DatabaseUnavailableError
# says why. The caller's own connections are never shut down by pgsolo this way.
@dataclass(frozen=True, slots=True)
class _Bound:
    seconds: float
    address: str  # for the error: a connection that was shut down no longer says it


_ANSWER_WITHIN: weakref.WeakKeyDictionary[
    psycopg.Connection[Any] | psycopg.AsyncConnection[Any], _Bound
] = weakref.WeakKeyDictionary()


def bound_answers(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], seconds: float
) -> None:
    _ANSWER_WITHIN[conn] = _Bound(seconds, f"{conn.info.host}:{conn.info.port}")


class _Deadline:
    """A hard deadline for one round trip on one of pgsolo's own connections."""

    def __init__(
        self,
        conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any],
        bound: _Bound,
        wait: float,
    ) -> None:
        self.conn = conn
        self.address = bound.address
        self.seconds = bound.seconds + wait
        self.expired = False
        self._ident = DEADLINES.arm(self.seconds, self._expire)

    def _expire(self) -> None:
        self.expired = True
        shut_down(self.conn)

    def end(self, failure: BaseException | None = None) -> None:
        """The round trip is over: disarm, and turn its failure into
        :class:`DatabaseUnavailableError` if the deadline caused it."""
        DEADLINES.disarm(self._ident)
        if self.expired and isinstance(failure, psycopg.Error):
            raise DatabaseUnavailableError(
                f"the database at {self.address} gave no answer within {self.seconds:g}s,"
                " so pgsolo shut its connection down",
                unresponsive=True,
            ) from failure


@contextlib.contextmanager
def _bounded(conn: psycopg.Connection[Any], bound: _Bound | None, wait: float) -> Iterator[None]:
    if bound is None:
        yield
        return
    deadline = _Deadline(conn, bound, wait)
    try:
        yield
    except BaseException as exc:
        deadline.end(exc)
        raise
    deadline.end()


# Connections on which a keeper's beat is in flight. The beat is one statement sent only
# when no transaction is open, and the connection is idle again when it ends; meanwhile
# libpq says ACTIVE, but for anyone else the connection is idle with its lock taken (they
# wait for it, as for any other statement), so pgsolo reports it as idle.
# Ids, not weak references: an id is added and removed around each beat (try/finally),
# and checking one costs nothing on the hot path (every lock reads the status).
_BEATING: set[int] = set()


class _PsycopgBase:
    _conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]

    @property
    def connection(self) -> object:
        return self._conn

    @property
    def begins_implicitly(self) -> bool:
        return not self._conn.autocommit

    def transaction_status(self) -> TxStatus:
        if self._conn.closed:
            return TxStatus.UNKNOWN
        if id(self._conn) in _BEATING:
            return TxStatus.IDLE
        return _STATUS[self._conn.info.transaction_status]

    # A closed connection raises on every ``info`` attribute; logs and errors about it
    # (a lost lock) then use what it said while it was open.
    _last_pid = 0
    _last_info = ServerInfo(database="?", host="?", port=None, user="?", application_name="")

    def backend_pid(self) -> int:
        if not self._conn.closed:
            self._last_pid = self._conn.info.backend_pid
        return self._last_pid

    def server_info(self) -> ServerInfo:
        if self._conn.closed:
            return self._last_info
        # From libpq's bytes, not psycopg's ``info`` strings, which decode with the
        # client_encoding: under SQL_ASCII a database or role named "grüße" would raise.
        # The connection parameters are the UTF-8 the caller gave; application_name is
        # ASCII (the server escapes the rest).
        pgconn = self._conn.pgconn
        self._last_info = ServerInfo(
            database=_text(pgconn.db),
            host=_text(pgconn.host),
            port=self._conn.info.port,
            user=_text(pgconn.user),
            application_name=_text(pgconn.parameter_status(b"application_name")),
        )
        return self._last_info

    def sqlstate(self, exc: BaseException) -> str | None:
        return exc.sqlstate if isinstance(exc, psycopg.Error) else None

    def is_closed(self) -> bool:
        return self._conn.closed or self._conn.broken

    def scrub(self, text: str) -> str:
        """``text`` with this connection's own password blanked out."""
        password = password_of(self._conn)
        return scrub_secrets(text, make_conninfo("", password=password)) if password else text

    def error_detail(self, exc: BaseException) -> str | None:
        return exc.diag.message_detail if isinstance(exc, psycopg.Error) else None

    def client_address(self) -> tuple[str, int] | None:
        with (
            contextlib.suppress(psycopg.Error, OSError),
            socket.socket(fileno=os.dup(self._conn.fileno())) as sock,
        ):
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                address = sock.getsockname()
                return str(address[0]), int(address[1])
        return None

    def _elsewhere_conninfo(self) -> str:
        """Where this connection goes, with its password (libpq never shows it in
        ``get_parameters``), for a short-lived second connection named ``pgsolo:probe``."""
        info = self._conn.info
        params: dict[str, Any] = dict(info.get_parameters())
        if password := password_of(self._conn):
            params["password"] = password
        params["application_name"] = "pgsolo:probe"
        if not os.environ.get("PGCONNECT_TIMEOUT"):
            params.setdefault("connect_timeout", str(PROBE_CONNECT_TIMEOUT))
        return make_conninfo("", **params)

    def _answer_within(self) -> float:
        """How long a second connection of pgsolo's to the same place may take to answer."""
        bound = _ANSWER_WITHIN.get(self._conn)
        return bound.seconds if bound is not None else PROBE_ANSWER_TIMEOUT

    def _beat_ready(self) -> bool:
        if self._conn.closed:
            raise BeatFailed("the connection is closed")
        pgconn = self._conn.pgconn
        # In pipeline mode psycopg does not hold its lock between statements, and libpq
        # refuses a plain query: the caller is using the connection.
        return (
            pgconn.transaction_status == pq.TransactionStatus.IDLE
            and pgconn.pipeline_status == pq.PipelineStatus.OFF
        )


def _text(value: bytes | None) -> str:
    return "" if value is None else value.decode("utf-8", errors="replace")


def password_of(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str | None:
    """The connection's password, as the caller gave it (UTF-8). psycopg's
    ``info.password`` decodes it with the client_encoding, which fails under SQL_ASCII."""
    value = conn.pgconn.password
    return value.decode("utf-8", errors="replace") if value else None


def _has_row(cursor: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    result = cursor.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK and result.ntuples > 0


def _literal(statement: str) -> bytes:
    # Statements come from pgsolo.sql only: fixed text and validated values. Bytes skip
    # psycopg's composition step, which a statement without parameters does not need.
    # ASCII only (see pgsolo.literals.sql_text), so no client_encoding can misread it.
    return statement.encode("ascii")


class PsycopgDriver(_PsycopgBase):
    is_async: ClassVar[bool] = False
    _conn: psycopg.Connection[Any]

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def _cursor(self) -> psycopg.Cursor[tuple[Any, ...]]:
        # The caller's connection may have any row factory; pgsolo reads plain tuples.
        return self._conn.cursor(row_factory=tuple_row)

    def fetch_value(self, statements: Sequence[str], wait: float = 0.0) -> object:
        with _bounded(self._conn, _ANSWER_WITHIN.get(self._conn), wait):
            cursor = self._cursor().execute(_literal("; ".join(statements)))
            value: object = None
            while True:
                if _has_row(cursor) and (row := cursor.fetchone()) is not None:
                    value = row[0]
                if not cursor.nextset():
                    return value

    def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        with psycopg.connect(self._elsewhere_conninfo(), autocommit=True) as other:
            bound_answers(other, self._answer_within())
            return PsycopgDriver(other).fetch_value(statements)

    def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None:
        # psycopg's own lock: while the keeper holds it, no statement of the caller's can
        # start on this connection, and the keeper never waits for it.
        if not self._conn.lock.acquire(blocking=False):
            return None
        try:
            if not self._beat_ready():
                return None
            _BEATING.add(id(self._conn))
            try:
                return _beat(self._conn.pgconn, statement, answer_within)
            finally:
                _BEATING.discard(id(self._conn))
        finally:
            self._conn.lock.release()


class AsyncPsycopgDriver(_PsycopgBase):
    is_async: ClassVar[bool] = True
    _conn: psycopg.AsyncConnection[Any]

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    def _cursor(self) -> psycopg.AsyncCursor[tuple[Any, ...]]:
        return self._conn.cursor(row_factory=tuple_row)

    async def fetch_value(self, statements: Sequence[str], wait: float = 0.0) -> object:
        # psycopg's own handling of a cancelled task is not safe enough for a lock: a
        # cancel request that reaches the server just before the statement starts is
        # ignored, so psycopg waits 5s and then closes the connection, and a lock wait
        # would go on meanwhile. So the round trip runs shielded in a task of its own;
        # if the caller is cancelled, _settle cancels the statement on the server
        # (repeating the request until it takes), lets the round trip finish, and only
        # then does the cancellation go on.
        call = _Call()
        bound = _ANSWER_WITHIN.get(self._conn)
        deadline = _Deadline(self._conn, bound, wait) if bound is not None else None
        block = asyncio.ensure_future(self._fetch(statements, call))
        try:
            value = await asyncio.shield(block)
        except asyncio.CancelledError:
            await _settle(self._conn, block, call)
            if deadline is not None:
                deadline.end()
            raise
        except BaseException as exc:
            if deadline is not None:
                deadline.end(exc)
            raise
        if deadline is not None:
            deadline.end()
        return value

    async def _fetch(self, statements: Sequence[str], call: _Call) -> object:
        # psycopg takes the connection's lock at once when it is free: then the
        # statements on the server are ours, and cancelling them hits nobody else.
        call.owns_connection = not self._conn.lock.locked()
        cursor = await self._cursor().execute(_literal("; ".join(statements)))
        value: object = None
        while True:
            if _has_row(cursor) and (row := await cursor.fetchone()) is not None:
                value = row[0]
            if not cursor.nextset():
                return value

    async def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        async with await psycopg.AsyncConnection.connect(
            self._elsewhere_conninfo(), autocommit=True
        ) as other:
            bound_answers(other, self._answer_within())
            return await AsyncPsycopgDriver(other).fetch_value(statements)

    async def beat(self, statement: str, answer_within: float) -> Sequence[str | None] | None:
        lock = self._conn.lock
        if lock.locked():
            return None
        async with lock:  # free, so taken without yielding to another task
            if not self._beat_ready():
                return None
            # libpq is driven from a worker thread; the connection stays locked until
            # that thread is done with it, even if this task is cancelled meanwhile.
            exchange = asyncio.ensure_future(
                asyncio.to_thread(_beat, self._conn.pgconn, statement, answer_within)
            )
            _BEATING.add(id(self._conn))
            try:
                return await asyncio.shield(exchange)
            except asyncio.CancelledError:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({exchange})
                raise
            finally:
                _BEATING.discard(id(self._conn))


class _Call:
    owns_connection = False


def _beat(pgconn: pq.abc.PGconn, statement: str, timeout: float) -> list[str | None]:
    """Send ``statement`` on ``pgconn`` and return its first row as text, within
    ``timeout`` seconds. libpq is called directly (not through psycopg's cursor, which
    would wait for the connection's lock the keeper already holds, and which on an
    ``autocommit=False`` connection would open a transaction first).

    The socket is watched through a duplicate of its descriptor: if the caller closes the
    connection meanwhile, a new socket that reuses the number is never touched. Whatever
    goes wrong once the statement is sent, the connection is shut down rather than handed
    back with a statement still in flight."""
    deadline = time.monotonic() + timeout
    row: list[str | None] | None = None
    error: str | None = None
    try:
        sock = socket.socket(fileno=os.dup(pgconn.socket))
    except (psycopg.Error, OSError) as exc:
        raise BeatFailed(f"the connection failed: {exc}") from exc
    try:
        pgconn.send_query(_literal(statement))
        try:
            while pgconn.flush():
                _wait_for_socket(sock, deadline, write=True)
            while True:
                pgconn.consume_input()
                if not pgconn.is_busy():
                    break
                _wait_for_socket(sock, deadline, write=False)
        except BaseException:
            _break(pgconn, sock)
            raise
        while (result := pgconn.get_result()) is not None:
            if result.status == pq.ExecStatus.TUPLES_OK and result.ntuples:
                row = [
                    None if (v := result.get_value(0, i)) is None else bytes(v).decode()
                    for i in range(result.nfields)
                ]
            elif result.status == pq.ExecStatus.FATAL_ERROR:
                message = (result.error_message or b"").decode(errors="replace")
                error = " ".join(message.split())  # libpq's messages span lines
        # Notifications that arrived with the answer go where psycopg keeps them for the
        # caller's notifies() (it would otherwise wait for the socket, which has nothing).
        while notification := pgconn.notifies():
            if pgconn.notify_handler:
                pgconn.notify_handler(notification)
    except (psycopg.Error, OSError, ValueError) as exc:
        raise BeatFailed(f"the connection failed: {' '.join(str(exc).split())}") from exc
    finally:
        sock.close()
    if error is not None or row is None:
        if pgconn.status != pq.ConnStatus.OK:
            raise BeatFailed(f"the connection failed: {error}")
        raise BeatFailed(f"the heartbeat statement failed: {error}", unresponsive=False)
    return row


def _wait_for_socket(sock: socket.socket, deadline: float, *, write: bool) -> None:
    """Until ``sock`` is ready, or :class:`BeatFailed` (unresponsive) at ``deadline``.
    poll(2), not select(2): a process with many files has descriptors above 1023."""
    poller = select.poll()
    poller.register(sock, select.POLLOUT if write else select.POLLIN)
    remaining = deadline - time.monotonic()
    if remaining <= 0 or not poller.poll(remaining * 1000):
        raise BeatFailed("the server did not answer in time", unresponsive=True)


def _break(pgconn: pq.abc.PGconn, sock: socket.socket) -> None:
    """Shut the connection down and let libpq see it (so every later use of the
    connection fails at once instead of finding the beat's statement in progress)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(psycopg.Error):
        pgconn.consume_input()


def shut_down(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """``shutdown(SHUT_RDWR)`` on the connection's socket, from any thread: whoever waits
    on it sees the end of the stream at once and the driver raises, instead of waiting for
    a server that may never answer (a half-open TCP connection, a stopped backend)."""
    with contextlib.suppress(psycopg.Error):
        shut_down_socket(conn.fileno())


async def _settle(
    conn: psycopg.AsyncConnection[Any], block: asyncio.Future[object], call: _Call
) -> None:
    """Bring an interrupted round trip to its end, bounded.

    Cancel its statement on the server, again every quarter of a second (a request
    that arrives before the statement starts, or between two statements of a
    pipeline, is ignored by the server). If another task was using the connection
    when the round trip started, its statement could be the one running: cancel only
    our task then, as psycopg would. After a few seconds, give up the same way.
    Further cancellations of the caller are absorbed: it is already on its way out
    with one.
    """
    loop = asyncio.get_running_loop()
    give_up = loop.time() + _SETTLE_SECONDS
    handed_over = False
    while not block.done():
        try:
            if call.owns_connection and loop.time() < give_up:
                if hasattr(conn, "cancel_safe"):  # psycopg >= 3.2
                    await conn.cancel_safe(timeout=_SETTLE_SECONDS)
                else:
                    await asyncio.to_thread(conn.cancel)
            elif not handed_over:  # once: a second interruption makes psycopg close it
                handed_over = True
                block.cancel()
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            logger.warning("pgsolo: cancelling an interrupted statement failed: %r", exc)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({block}, timeout=0.25)
    if not block.cancelled():
        block.exception()  # retrieved: the caller's cancellation is what propagates
