"""The pg8000 adapter (sync only: pg8000 has no asyncio API): pgsolo's driver protocol
(:class:`~pgsolo.drivers.SyncDriver`) on a pg8000 DB-API connection, the one
``pg8000.connect()`` and ``pg8000.dbapi.connect()`` return (and Google's Cloud SQL Python
Connector hands out). ``pg8000.native.Connection`` is not taken: pass a DB-API one.

Round trips. A statement without parameters goes to the server as one simple-query
message, so the statements of one call are one round trip; pg8000 keeps the rows of every
statement of the message, and pgsolo's statements that return rows return one row each,
so the value is the last row's. With ``autocommit`` off, pg8000 sends a BEGIN of its own
and waits for it before the first statement of a transaction (as psycopg does): one round
trip more. pg8000 keeps no book of the transaction but the server's status, so pgsolo's
COMMIT or ROLLBACK goes in the same message as the statements.

What pg8000 cannot do, declared rather than found out at run time:

- **No keeper.** A pg8000 connection must not be used by two threads at once (it has no
  lock of its own), so a heartbeat could interleave its messages with the caller's:
  ``keep=`` is refused (:class:`~pgsolo.drivers.Lacking`, a
  :class:`~pgsolo.UsageError` before any SQL), and there is no socket to watch.
- **No cancellation.** pg8000 has no API to cancel a statement, and an exception raised in
  the middle of its exchange (Ctrl-C arrives as one) would leave the rest of the server's
  answer unread and the connection unusable. So a SIGINT that arrives during one of
  pgsolo's round trips (in the main thread, where Python handles signals) is held until
  the round trip ends, and then raised, as psycopg2 does: a lock wait ends first, when
  granted or at the end of its slice (``WAIT_SLICE_SECONDS``, 2 s), and pgsolo then
  releases what was granted.
- **No database name without asking.** pg8000 does not keep the name of the database it
  connected to: it is read once per connection (``current_database()``, one round trip),
  when a log line or an error first needs it and the connection is not in a failed
  transaction (until then it is ``?``).

pg8000 offers no public API for some of what pgsolo reads without a round trip: the
transaction status and the backend's pid (the server's ReadyForQuery and BackendKeyData
messages) and the socket: they are private attributes, read in
:mod:`pgsolo.drivers._pg8000_private` only (which names the versions it was checked on).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import pg8000.dbapi
import pg8000.exceptions
import pg8000.legacy
from psycopg.conninfo import make_conninfo

from .._interrupts import ctrl_c_held
from .._weakmap import IdentityWeakMap
from . import UNKNOWN_SERVER, Edge, Lacking, ServerInfo, SyncDriver, SyncHeartbeat, TxStatus, edged
from . import _pg8000_private as private
from .conninfo import scrub_secrets
from .deadlines import host_port, socket_address

__all__ = ["KEEPER_REFUSED", "Pg8000Driver", "adapt"]

# A second, short-lived connection to the place the caller's connection goes (the proxy
# check): pg8000's timeout bounds the connect and each answer alike.
PROBE_TIMEOUT = 30.0

KEEPER_REFUSED = (
    "a pg8000 connection cannot be shared between threads (it has no lock of its own), so"
    " a heartbeat would interleave its messages with the caller's statements; use a"
    " psycopg 3 connection for keep="
)

# The server's transaction status as ReadyForQuery says it (pg8000 keeps its byte).
_STATUS = {b"I": TxStatus.IDLE, b"T": TxStatus.INTRANS, b"E": TxStatus.INERROR}
# The statuses of a connection with no transaction open (None: no statement yet); any
# other is asked the long way (transaction_status).
_IDLE = frozenset({None, b"I"})

_CONNECTIONS = (pg8000.dbapi.Connection, pg8000.legacy.Connection)

# What each connection said once, by connection: its database's name (module doc), and
# whether its socket failed (pg8000 leaves a connection open after a network error).
_DATABASES: IdentityWeakMap[Any, str] = IdentityWeakMap()
_BROKEN: weakref.WeakSet[Any] = weakref.WeakSet()


def adapt(connection: object) -> SyncDriver | None:
    """The adapter of a pg8000 DB-API connection; None for other pg8000 objects."""
    return Pg8000Driver(connection) if isinstance(connection, _CONNECTIONS) else None


class Pg8000Driver:
    """pgsolo's driver protocol on a pg8000 DB-API connection; see the module docstring."""

    is_async: ClassVar[bool] = False
    lone_calls: ClassVar[None] = None  # every round trip is fetch_value's
    ends_by_message: ClassVar[bool] = True
    session_locks_refused: ClassVar[str | None] = None
    transaction_hint: ClassVar[str] = "conn.autocommit = False"
    ending_advice: ClassVar[str] = "commit or roll it back first (conn.commit() / conn.rollback())"

    def __init__(self, conn: Any) -> None:
        self._conn = self.connection = conn  # what pgsolo tracks held locks by
        self._last_pid = 0
        self._last_info = UNKNOWN_SERVER

    @property
    def begins_implicitly(self) -> bool:
        return not self._conn.autocommit

    def transaction_status(self) -> TxStatus:
        if self.is_closed():
            return TxStatus.UNKNOWN
        # None until the first statement: the server was idle when it said it was ready.
        status = private.transaction_status(self._conn)
        return TxStatus.IDLE if status is None else _STATUS.get(status, TxStatus.IDLE)

    def idle_pid(self) -> int | None:
        if self.is_closed() or private.transaction_status(self._conn) not in _IDLE:
            return None
        return self.backend_pid()

    def backend_pid(self) -> int:
        key_data = private.backend_key_data(self._conn)  # BackendKeyData: the pid, then the secret
        if not self.is_closed() and key_data:
            self._last_pid = int(struct.unpack("!i", key_data[:4])[0])
        return self._last_pid

    def server_info(self) -> ServerInfo:
        if self.is_closed():
            return self._last_info
        try:
            host, port = host_port(self._peer())
        except pg8000.exceptions.InterfaceError:  # broken just now: what it said while open
            return self._last_info
        statuses = self._conn.parameter_statuses
        user = self._conn.user
        self._last_info = ServerInfo(
            database=self._database(),
            host=host,
            port=port,
            user=user.decode("utf-8") if isinstance(user, bytes) else str(user),
            application_name=str(statuses.get("application_name", "")),
        )
        return self._last_info

    def sqlstate(self, exc: BaseException) -> str | None:
        fields = _fields(exc)
        return str(fields["C"]) if "C" in fields else None

    def error_detail(self, exc: BaseException) -> str | None:
        fields = _fields(exc)
        return str(fields["D"]) if "D" in fields else None

    def is_closed(self) -> bool:
        return private.sock(self._conn) is None or self._conn in _BROKEN

    def scrub(self, text: str) -> str:
        password = _text(self._conn.password)
        return scrub_secrets(text, make_conninfo("", password=password)) if password else text

    def client_address(self) -> tuple[str, int] | None:
        return None if self.is_closed() else socket_address(_socket(self._conn).fileno())

    def heartbeat(self) -> SyncHeartbeat | Lacking:
        return Lacking(KEEPER_REFUSED)

    def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        sent = edged(statements, edge, self)
        try:
            return _exchange(self._conn, sent) if sent else None
        except OSError:  # pg8000 lets some through as they are (a reset while reading)
            _BROKEN.add(self._conn)
            raise
        except pg8000.exceptions.InterfaceError as exc:
            if isinstance(exc.__cause__, OSError) or str(exc) == "network error":
                _BROKEN.add(self._conn)  # pg8000 leaves it open, and says nothing more
            raise

    def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        peer = self._peer()
        host, port = host_port(peer)
        where: dict[str, Any] = (
            {"host": host, "port": port} if isinstance(peer, tuple) else {"unix_sock": peer}
        )
        other = pg8000.dbapi.connect(
            user=self._conn.user,
            password=self._conn.password,
            database=self._database(),
            ssl_context=True if _is_tls(_socket(self._conn)) else None,
            application_name="pgsolo:probe",
            timeout=PROBE_TIMEOUT,
            **where,
        )
        try:
            other.autocommit = True
            return Pg8000Driver(other).fetch_value(statements)
        finally:
            with contextlib.suppress(pg8000.exceptions.Error):
                other.close()

    def _peer(self) -> Any:
        """The server's end of the socket. A socket the network reset has none (ENOTCONN)
        although pg8000 keeps it open: it is broken, as after a failed round trip, and
        says so in pg8000's words for a broken socket."""
        try:
            return _socket(self._conn).getpeername()
        except OSError as exc:
            _BROKEN.add(self._conn)
            raise pg8000.exceptions.InterfaceError("network error") from exc

    def _database(self) -> str:
        """The name of the connection's database (module doc: asked once)."""
        known = _DATABASES.get(self._conn)
        status = self.transaction_status()
        if known is None and status in (TxStatus.IDLE, TxStatus.INTRANS):
            # With autocommit off the read would begin a transaction: outside one, it runs
            # as its own message, so it leaves none open. A connection that fails it says
            # so at pgsolo's next statement, which is what reports it.
            with (
                contextlib.suppress(pg8000.exceptions.Error),
                _autocommit(self._conn, on=status is TxStatus.IDLE),
            ):
                known = _DATABASES[self._conn] = str(
                    _exchange(self._conn, ["SELECT current_database()"])
                )
        return known or "?"


@contextlib.contextmanager
def _autocommit(conn: Any, *, on: bool) -> Iterator[None]:
    """``conn`` with autocommit on for a statement that must open no transaction."""
    was = conn.autocommit
    conn.autocommit = was or on
    try:
        yield
    finally:
        conn.autocommit = was


def _exchange(conn: Any, statements: Sequence[str]) -> object:
    """Send ``statements`` as one message; the first value of the last row that came back
    (module doc), with a SIGINT held until the exchange is over."""
    with ctrl_c_held():  # pg8000 can neither cancel nor be cut off mid-message
        cursor = conn.cursor()  # a DB-API cursor is no context manager in pg8000
        try:
            cursor.execute("; ".join(statements))
            if cursor.description is None:
                return None
            rows = cursor.fetchall()
            return rows[-1][0] if rows else None
        finally:
            cursor.close()


def _fields(exc: BaseException) -> dict[str, Any]:
    """The fields of the server's ErrorResponse that a pg8000 error carries (by their
    one-letter codes: C the SQLSTATE, D the detail); none for pg8000's own errors."""
    if isinstance(exc, pg8000.exceptions.DatabaseError) and exc.args:
        fields = exc.args[0]
        if isinstance(fields, dict):
            return fields
    return {}


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace") or None
    return str(value) if value else None


def _socket(conn: Any) -> socket.socket:
    """The connection's socket; pg8000's own error for one it closed, as its calls raise."""
    usock = private.sock(conn)
    if usock is None:
        raise pg8000.exceptions.InterfaceError("connection is closed")
    return usock


def _is_tls(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket)
