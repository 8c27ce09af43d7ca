"""The psycopg2 adapter (sync only: psycopg2 has no asyncio API).

Round trips. psycopg2 sends the statements of one ``execute()`` as one simple-query
message, but keeps only the result of the LAST statement: a value read before a COMMIT,
``RELEASE SAVEPOINT`` or ``SET`` at the end of the message would be lost. So a message
whose last statements return no row is split after the last one that may: those trailing
statements go in a second round trip (see :func:`split_trailing`). That costs one round
trip more than psycopg 3 for a session lock taken with a wait, an unlock inside the
caller's transaction (savepoint around it), a session lock on an ``autocommit=False``
connection, and a job's verified COMMIT. A transaction lock in
pgsolo's own transaction (``with xact_lock(...)`` on an autocommit connection) and a
session lock try on an autocommit connection or inside the caller's transaction (where
its savepoint stays open for the block) stay one round trip. On an
``autocommit=False`` connection psycopg2 sends a BEGIN of its own and waits for it before
the first statement of a transaction, as psycopg 3 does: one round trip more again.

No keeper. psycopg2 serialises the statements on a connection with a lock of its own
that Python cannot try without waiting, so a beat could end up queued behind the
caller's statement (and its hard deadline would then cut the caller's connection), or
open a transaction on an ``autocommit=False`` connection. ``keep=`` is refused
(:data:`KEEPER_REFUSED`, a :class:`~pgsolo.drivers.Lacking` heartbeat).

Interruptions. psycopg2 waits for the server inside libpq with the GIL released: a
KeyboardInterrupt (Ctrl-C) is raised only once the statement has ended (a lock wait ends
when granted or at its timeout); pgsolo then releases what was granted. With
``psycopg2.extensions.set_wait_callback(psycopg2.extras.wait_select)`` psycopg2 cancels
the statement on the server at once instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any, ClassVar

import psycopg2
import psycopg2.extensions
from psycopg.conninfo import make_conninfo
from psycopg2.extensions import connection as Connection

from .. import sql
from . import UNKNOWN_SERVER, Edge, Lacking, ServerInfo, SyncDriver, SyncHeartbeat, TxStatus, edged
from ._psycopg import PROBE_ANSWER_TIMEOUT, PROBE_CONNECT_TIMEOUT
from .conninfo import scrub_secrets
from .deadlines import DEADLINES, shut_down_socket, socket_address

__all__ = ["KEEPER_REFUSED", "Psycopg2Driver", "adapt", "split_trailing"]

_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE
_STATUS = {
    _IDLE: TxStatus.IDLE,
    psycopg2.extensions.TRANSACTION_STATUS_ACTIVE: TxStatus.ACTIVE,
    psycopg2.extensions.TRANSACTION_STATUS_INTRANS: TxStatus.INTRANS,
    psycopg2.extensions.TRANSACTION_STATUS_INERROR: TxStatus.INERROR,
    psycopg2.extensions.TRANSACTION_STATUS_UNKNOWN: TxStatus.UNKNOWN,
}

KEEPER_REFUSED = (
    "psycopg2 serialises the statements on a connection with a lock that cannot be"
    " tried without waiting, so a heartbeat could queue behind the caller's statement"
    " (and its deadline would then cut the caller's connection) or open a transaction;"
    " use a psycopg 3 connection for keep="
)


# The statements of pgsolo's that never return a row, by their first word. pgsolo's
# statements that return rows all start with SELECT; anything else is treated as one
# that may, so that a value is never lost.
def adapt(connection: object) -> SyncDriver | None:
    """The adapter of a psycopg2 connection (any subclass); None for other psycopg2
    objects (a cursor)."""
    return Psycopg2Driver(connection) if isinstance(connection, Connection) else None


def split_trailing(statements: Sequence[str]) -> tuple[list[str], list[str]]:
    """``statements`` cut after the last one that may return a row: what psycopg2 must
    send in one ``execute()`` to read its value, and the rest (which return none)."""
    cut = len(statements)
    while cut > 0 and not sql.returns_rows(statements[cut - 1]):
        cut -= 1
    return list(statements[:cut]), list(statements[cut:])


class Psycopg2Driver:
    """pgsolo's driver protocol (:class:`~pgsolo.drivers.SyncDriver`) on a psycopg2
    connection."""

    is_async: ClassVar[bool] = False
    lone_calls: ClassVar[None] = None  # every round trip is fetch_value's
    ends_by_message: ClassVar[bool] = True
    session_locks_refused: ClassVar[str | None] = None
    # psycopg2 has no transaction block of its own: with autocommit off it opens one at
    # the first statement (the caller then commits).
    transaction_hint: ClassVar[str] = "conn.autocommit = False"
    ending_advice: ClassVar[str] = "commit or roll it back first (conn.commit() / conn.rollback())"

    # A closed connection has no backend pid or parameters any more; logs and errors
    # about it (a lost lock) use what it said while it was open.
    _last_pid = 0
    _last_info = UNKNOWN_SERVER

    def __init__(self, conn: Connection) -> None:
        self._conn = self.connection = conn  # what pgsolo tracks held locks by

    @property
    def begins_implicitly(self) -> bool:
        return not self._conn.autocommit

    def transaction_status(self) -> TxStatus:
        if self._conn.closed:
            return TxStatus.UNKNOWN
        return _STATUS.get(self._conn.info.transaction_status, TxStatus.UNKNOWN)

    def idle_pid(self) -> int | None:
        conn = self._conn
        if conn.closed or conn.info.transaction_status != _IDLE:
            return None
        self._last_pid = conn.info.backend_pid
        return self._last_pid

    def backend_pid(self) -> int:
        if not self._conn.closed:
            self._last_pid = self._conn.info.backend_pid
        return self._last_pid

    def server_info(self) -> ServerInfo:
        if self._conn.closed:
            return self._last_info
        info = self._conn.info
        port = info.port
        self._last_info = ServerInfo(
            database=info.dbname or "",
            host=info.host or "",
            port=int(port) if port else None,
            user=info.user or "",
            application_name=info.parameter_status("application_name") or "",
        )
        return self._last_info

    def sqlstate(self, exc: BaseException) -> str | None:
        return exc.pgcode if isinstance(exc, psycopg2.Error) else None

    def error_detail(self, exc: BaseException) -> str | None:
        return exc.diag.message_detail if isinstance(exc, psycopg2.Error) else None

    def is_closed(self) -> bool:
        return bool(self._conn.closed)

    def scrub(self, text: str) -> str:
        password = self._password()
        return scrub_secrets(text, make_conninfo("", password=password)) if password else text

    def client_address(self) -> tuple[str, int] | None:
        try:
            fileno = self._conn.fileno()
        except psycopg2.Error:
            return None
        return socket_address(fileno)

    def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        sent = edged(statements, edge, self)
        # psycopg2 keeps its own book of the transaction it began, and sends BEGIN only
        # when that book says none is open: a COMMIT or ROLLBACK sent as a statement would
        # leave the book open, and the caller's next statements would run outside any
        # transaction, each committed at once. The transaction psycopg2 began is ended
        # through psycopg2, at either end of the message. What follows a ROLLBACK runs
        # outside that transaction, so in one psycopg2 begins for it, ended here too.
        if sent and sent[0] == sql.ROLLBACK and self.begins_implicitly:
            self._conn.rollback()
            sent = sent[1:]
            if sent and sent[-1] not in (sql.COMMIT, sql.ROLLBACK):
                sent.append(sql.COMMIT)
        ending = None
        if self.begins_implicitly and sent and sent[-1] in (sql.COMMIT, sql.ROLLBACK):
            ending = sent.pop()
        head, tail = split_trailing(sent)
        if not head:
            head, tail = tail, []
        value = self._execute(head) if head else None
        if tail:
            self._execute(tail)
        if ending == sql.COMMIT:
            self._conn.commit()
        elif ending == sql.ROLLBACK:
            self._conn.rollback()
        return value

    def _execute(self, statements: Sequence[str]) -> object:
        # A plain cursor: the caller's connection may have a cursor_factory of its own
        # (dicts, named tuples). No parameters, so psycopg2 leaves "%" alone; bytes, as
        # the statements are ASCII (pgsolo.sql), so no client_encoding can misread them.
        with self._conn.cursor(cursor_factory=psycopg2.extensions.cursor) as cursor:
            cursor.execute("; ".join(statements).encode("ascii"))
            if cursor.description is None:
                return None
            row = cursor.fetchone()
            return None if row is None else row[0]

    def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        params: dict[str, Any] = dict(self._conn.info.dsn_parameters)
        if password := self._password():
            params["password"] = password
        params["application_name"] = "pgsolo:probe"
        if not os.environ.get("PGCONNECT_TIMEOUT"):
            params.setdefault("connect_timeout", str(PROBE_CONNECT_TIMEOUT))
        # What libpq reports but does not take back (psycopg2 < 2.9.4 lists them).
        for derived in ("krbsrvname", "gsslib"):
            params.pop(derived, None)
        other = psycopg2.connect(**params)
        try:
            other.autocommit = True
            # Shut down past the deadline: a server that never answers must not hold
            # pgsolo (the caller's connection answered a moment ago).
            ident = DEADLINES.arm(PROBE_ANSWER_TIMEOUT, lambda: shut_down_socket(other.fileno()))
            try:
                return Psycopg2Driver(other).fetch_value(statements)
            finally:
                DEADLINES.disarm(ident)
        finally:
            other.close()

    def heartbeat(self) -> SyncHeartbeat | Lacking:
        return Lacking(KEEPER_REFUSED)

    def _password(self) -> str | None:
        with contextlib.suppress(psycopg2.Error):
            return self._conn.info.password or None
        return None
