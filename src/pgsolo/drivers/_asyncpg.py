"""The asyncpg adapter: pgsolo's driver protocol (:class:`~pgsolo.drivers.AsyncDriver`) on
an ``asyncpg.Connection``, or on one acquired from an ``asyncpg.Pool`` (its
``PoolConnectionProxy`` is unwrapped: pgsolo keeps its books by the connection itself).

**One round trip per call, through COPY.** asyncpg sends a script of several statements
(``Connection.execute``) as one simple-query message, but drops the rows that come back;
``fetchval`` returns a row, but of one statement, over the extended protocol: a Parse and
Describe round trip for a statement its cache has not seen (each key's lock statement is
new text), then Bind and Execute, and a named prepared statement that a
transaction-pooling PgBouncer cannot follow. A hand-written recipe (``async with
conn.transaction(): await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", k)``)
costs BEGIN, the lock and COMMIT: 3 round trips once the statement is cached, 4 before; a
wait adds a ``SET LOCAL lock_timeout``. Here the statement whose row pgsolo reads (the
last ``SELECT``; pgsolo's statements that return rows are one-row SELECTs) goes inside
``COPY (...) TO STDOUT`` in the same simple-query message as the statements before and
after it (the value of an ``INSERT ... RETURNING`` the same way): asyncpg's COPY-out
exchange sends the message as it is, skips the other statements' answers, and hands over
the COPY's data: one round trip, as with psycopg, and no prepared statement. The value
comes back as text with its type name (``pg_typeof``) and is read back as the bool, int,
bytes or str psycopg would have given. The statement runs in a CTE, which PostgreSQL
evaluates once when it calls a volatile function (the lock functions are), although its
value is named twice. A statement that answers true, false or NULL
(:class:`pgsolo.sql.Truth`: taking and releasing a lock), when it is the message's last,
skips the COPY, which costs the server more than the statement itself: it goes inside a
plain SELECT whose row count carries the answer (:func:`pgsolo.sql.truth_by_count`), read
from the status ``execute()`` returns.

**Transactions.** Outside ``conn.transaction()`` asyncpg runs in autocommit
(``begins_implicitly`` is False); inside it, a transaction lock joins that transaction and
ends with it. asyncpg does not tell a failed transaction from an open one without a round
trip (its protocol keeps the server's status to itself), so a failure inside the block of a
transaction pgsolo opened is found at its COMMIT: the server answers ROLLBACK (or the
commit's check fails as "transaction aborted"), and :class:`~pgsolo.TransactionFailedError`
is raised with nothing committed. pgsolo's own transaction (``async with xact_lock(conn)``
with none open) is a plain BEGIN in the lock's message, so asyncpg takes it for a manually
started one: ``conn.transaction()`` inside that block is refused by asyncpg; open the
transaction with ``conn.transaction()`` first and take the lock inside it instead.

**Pools.** ``Pool.release()`` runs ``pg_advisory_unlock_all()`` and ``RESET ALL``: a session
lock lives only while its connection is checked out. A driver belongs to one checkout
(asyncpg counts releases, ``_pool_release_ctr``): once the connection went back to the pool
it reports itself closed, so releasing a lock taken before is a
:class:`~pgsolo.LockLostError`, and pgsolo keeps its books per checkout (:class:`Checkout`),
so the next one can take those keys again. Waits bound themselves with a ``lock_timeout``
for their transaction only, which ``RESET ALL`` cannot undo.

**Cancellation.** A cancelled task never reaches asyncpg's COPY-out exchange, or a
message that may wait for a lock: those run shielded, in the caller's own task
(:mod:`pgsolo.drivers._in_place`), which a cancellation reaches only once the exchange
ended. asyncpg's COPY-out can set a result
on the waiter a cancellation had just cancelled, and close the connection (a Ctrl-C under
``asyncio.run`` did so in about one interruption in fifty); and asyncpg asks the server
once to cancel a statement, which a wait could miss. pgsolo asks the server to cancel the
statement instead, again until the exchange ends, and its recovery then asks the server
whether the lock was granted meanwhile and releases it if so. Any other message (a try,
an unlock) ends on the server in any case, and is asyncpg's own round trip (the run of
a prepared statement, or ``execute()``), whose own cancellation is safe there.

**No keeper.** asyncpg refuses a second operation on a connection while one runs
(``InterfaceError: another operation is in progress``) instead of queueing it: a
heartbeat in flight would make the caller's own query fail at random, so ``keep=`` is
refused (:class:`~pgsolo.drivers.Lacking`: a :class:`~pgsolo.UsageError` before any SQL,
as on every driver without a heartbeat).

asyncpg offers no public API for some of this: the connection's address and parameters,
the COPY-out exchange, the statement and release counters, the connection behind a pool's
proxy and the cancel request are private attributes, all read in
:mod:`pgsolo.drivers._asyncpg_private` (which names the asyncpg versions it was checked on).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

import asyncpg
from asyncpg.pool import PoolConnectionProxy
from psycopg.conninfo import make_conninfo

from .. import sql
from .._weakmap import IdentityWeakMap
from ..errors import TransactionFailedError, UnsupportedConnectionError
from . import (
    UNKNOWN_SERVER,
    AsyncDriver,
    AsyncHeartbeat,
    Edge,
    Lacking,
    Rows,
    ServerInfo,
    TxStatus,
    edged,
    prepared,
)
from . import _asyncpg_private as private
from ._in_place import awaited_in_place
from .conninfo import scrub_secrets
from .deadlines import host_port

__all__ = ["KEEPER_REFUSED", "AsyncpgDriver", "Checkout", "adapt"]

# A second, short-lived connection to the place the caller's connection goes (the proxy
# check): the caller's connection answered a moment ago, so these are generous.
PROBE_CONNECT_TIMEOUT = 10.0
PROBE_ANSWER_TIMEOUT = 30.0

_SETTLE_SECONDS = 5.0
# How many times a lock call runs as written on a connection before pgsolo prepares it
# there: psycopg's default prepare_threshold (asyncpg has no such setting), so that a
# connection that takes a lock once, `pgsolo run`'s, never pays the Parse round trip.
PREPARE_AFTER = 5
# How many lock calls (a key's try or unlock each) a checkout keeps ready to send alone.
_LONE_MAX = 4096

T = TypeVar("T")

KEEPER_REFUSED = (
    "asyncpg refuses a second operation on a connection while one runs (InterfaceError:"
    " another operation is in progress), so a heartbeat would make the caller's queries"
    " fail at random. Check with lock.is_held() between steps instead."
)


def adapt(connection: object) -> AsyncDriver | None:
    """The adapter of an asyncpg connection (see :func:`pgsolo.drivers.adapt`)."""
    # What isinstance(connection, asyncpg.Connection) asks, without the Python of asyncpg's
    # metaclass (every lock comes here), which says True for a pool's proxy too.
    if asyncpg.Connection in type(connection).__mro__:
        return AsyncpgDriver(connection)
    if isinstance(connection, PoolConnectionProxy):
        conn = private.connection_behind(connection)
        if conn is None:
            raise UnsupportedConnectionError(
                "this asyncpg connection was released back to its pool; pass one that is"
                " checked out (inside async with pool.acquire() as conn)"
            )
        return AsyncpgDriver(conn)
    if isinstance(connection, asyncpg.Pool):
        raise UnsupportedConnectionError(
            "an asyncpg Pool is not a connection: a lock belongs to one session, so acquire"
            " one (async with pool.acquire() as conn) and pass that"
        )
    return None


class AsyncpgDriver:
    """pgsolo's driver protocol on an asyncpg connection; see the module docstring."""

    is_async: ClassVar[bool] = True
    ends_by_message: ClassVar[bool] = True
    session_locks_refused: ClassVar[str | None] = None
    transaction_hint: ClassVar[str] = "async with conn.transaction():"
    ending_advice: ClassVar[str] = "call it outside `async with conn.transaction():`"
    # Never: outside conn.transaction() asyncpg runs in autocommit. An attribute, not a
    # property: every lock reads it.
    begins_implicitly = False

    # Every lock makes one: no dict of its own to allocate and free.
    __slots__ = ("_aborted_at", "_checkout", "_conn", "_last_info", "connection", "lone_calls")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        # This checkout's (asyncpg counts releases), written out: every lock makes a driver.
        number = private.releases(conn)
        checkout = _CHECKOUTS.get(conn)
        if checkout is None or checkout.number != number:
            pid = 0 if conn.is_closed() else int(conn.get_server_pid())
            checkout = _CHECKOUTS[conn] = Checkout(
                conn, number, private.caches_statements(conn), pid
            )
        # What pgsolo tracks held locks by, and sends a lone lock call with: this checkout
        # of the connection (attributes, not properties: every lock reads them).
        self._checkout = self.connection = self.lone_calls = checkout
        self._aborted_at: int | None = None  # see transaction_status
        self._last_info = UNKNOWN_SERVER

    def transaction_status(self) -> TxStatus:
        conn = self._conn  # is_closed() written out: every lock asks this twice
        protocol = private.open_protocol(conn)
        if protocol is None or private.releases(conn) != self._checkout.number:
            return TxStatus.UNKNOWN
        if not protocol.is_in_transaction():
            return TxStatus.IDLE
        # asyncpg does not say whether the open transaction is aborted: pgsolo knows when
        # its own round trip aborted it, until the next statement on the connection (any
        # other is the caller's, and may have rolled back to a savepoint of its own). An
        # abort pgsolo did not see is found at its COMMIT (module doc).
        aborted = self._aborted_at is not None and self._aborted_at == self._queries()
        return TxStatus.INERROR if aborted else TxStatus.INTRANS

    def idle_pid(self) -> int | None:
        # is_closed() and transaction_status() at once: every lock asks this twice.
        conn = self._conn
        protocol = private.open_protocol(conn)
        if (
            protocol is None
            or protocol.is_in_transaction()
            or private.releases(conn) != self._checkout.number
        ):
            return None
        return self._checkout.pid

    def backend_pid(self) -> int:
        # Read as the checkout began: an asyncpg connection talks to one backend for its
        # life, and one that went back to its pool still talks to the same.
        return self._checkout.pid

    def server_info(self) -> ServerInfo:
        if self.is_closed():
            return self._last_info
        host, port = host_port(private.address(self._conn))
        params = private.parameters(self._conn)
        settings = self._conn.get_settings()
        self._last_info = ServerInfo(
            database=str(params.database or ""),
            host=host,
            port=port,
            user=str(params.user or ""),
            application_name=str(getattr(settings, "application_name", "") or ""),
        )
        return self._last_info

    def sqlstate(self, exc: BaseException) -> str | None:
        return _sqlstate(exc)

    def is_closed(self) -> bool:
        # Or the pooled connection went back to its pool since this driver was made.
        conn = self._conn
        return (
            private.open_protocol(conn) is None or private.releases(conn) != self._checkout.number
        )

    def error_detail(self, exc: BaseException) -> str | None:
        if isinstance(exc, asyncpg.PostgresError):
            detail = getattr(exc, "detail", None)
            return str(detail) if detail else None
        return None

    def scrub(self, text: str) -> str:
        """``text`` with this connection's own password blanked out."""
        password = self._password()
        return scrub_secrets(text, make_conninfo("", password=password)) if password else text

    def client_address(self) -> tuple[str, int] | None:
        address = private.client_socket(self._conn)
        if isinstance(address, tuple) and len(address) >= 2:  # (host, port, ...)
            return str(address[0]), int(address[1])
        return None  # a unix socket

    # - round trips -

    async def fetch_value(
        self, statements: Sequence[str], wait: float = 0.0, edge: Edge | None = None
    ) -> object:
        # One simple-query message (module docstring). A lock call alone (a session lock's
        # try or unlock, guarded or not) is asyncpg's own round trip (_lock_call).
        # Anything else runs shielded from the caller's cancellation (_shielded): it may
        # begin or end a transaction, and asyncpg's own cancellation hands the
        # cancellation on before the server answered, while asyncpg still reports the
        # transaction as it was (a Ctrl-C left run_once's open, once in a thousand
        # interruptions); it may wait for a lock, and asyncpg asks the server once to
        # cancel it; it may read a COPY, whose waiter asyncpg's protocol can break.
        call = statements[0] if edge is None and not wait and len(statements) == 1 else None
        try:
            if isinstance(call, sql.LoneCall):
                rows = await _lock_call(self._conn, call, self._checkout)
                self._aborted_at = None
                return rows[0][0]
            sent = statements if edge is None else edged(statements, edge, self)
            if not sent:
                return None
            self._refuse_if_released()
            tag, value = await _shielded(self._conn, _exchange_once(self._conn, sent))
        except asyncio.CancelledError:
            await self._find_out_if_aborted()
            raise
        except (asyncpg.InterfaceError, asyncpg.InternalClientError) as exc:
            if not private.transport_closing(self._conn):
                raise
            # The server's end arrived, and asyncpg takes it in a turn of the loop later:
            # meanwhile its protocol, busy with the server's last message, refuses the
            # statement as an internal error. It is a closed connection, as asyncpg says
            # once it took the end in (then is_closed() is true: a Locker throws it away).
            await asyncio.sleep(0)
            raise asyncpg.ConnectionDoesNotExistError("the server closed the connection") from exc
        except asyncpg.PostgresError as exc:
            if type(call) is sql.LockCall and self._checkout.forgets(exc):
                return await self.fetch_value(statements, wait, edge)
            # An error inside a transaction block aborts it. A connection asyncpg aborted
            # meanwhile (pool.release() of it, a timeout) has no protocol left to ask.
            in_transaction = not self.is_closed() and self._conn.is_in_transaction()
            self._aborted_at = self._queries() if in_transaction else None
            failed = sql.meaning(self.sqlstate(exc)) is sql.Meaning.TRANSACTION_FAILED
            if edge == "commit" and failed:
                await self._conn.execute(sql.ROLLBACK)
                raise _failed_transaction() from exc
            raise
        self._aborted_at = None
        if edge == "commit" and tag == sql.ROLLBACK:  # COMMIT of an aborted transaction
            raise _failed_transaction()
        return value

    async def fetch_value_elsewhere(self, statements: Sequence[str]) -> object:
        host, port = host_port(private.address(self._conn))
        params = private.parameters(self._conn)
        other = await asyncpg.connect(
            host=host,
            port=port,
            user=params.user,
            database=params.database,
            password=params.password,
            ssl=_ssl_of(params),
            server_settings={"application_name": "pgsolo:probe"},
            timeout=PROBE_CONNECT_TIMEOUT,
        )
        try:
            async with asyncio.timeout(PROBE_ANSWER_TIMEOUT):
                return await AsyncpgDriver(other).fetch_value(statements)
        finally:
            other.terminate()

    def heartbeat(self) -> AsyncHeartbeat | Lacking:
        return Lacking(KEEPER_REFUSED)

    # - helpers -

    def _refuse_if_released(self) -> None:
        """A connection that went back to its pool since this driver was made may be the
        next borrower's: what pgsolo would send now (the COMMIT or ROLLBACK of its own
        transaction) would end the borrower's. Refused as asyncpg refuses a released
        connection's proxy; a lock call needs no check here, since every lock checks
        ``is_closed()`` before one."""
        if private.releases(self._conn) != self._checkout.number:
            raise asyncpg.InterfaceError(
                "the connection went back to its pool: pgsolo sends nothing more on it,"
                " since it may be another's by now"
            )

    def _queries(self) -> int:
        """How many statements asyncpg has sent on the connection (pgsolo's COPY-out
        messages aside): what tells whether anything ran since pgsolo's last round trip."""
        return private.queries_sent(self._conn)

    async def _find_out_if_aborted(self) -> None:
        """After a cancelled round trip in a transaction: whether the cancellation aborted
        it (it did if it landed on a statement), asked with a statement that changes
        nothing either way (an aborted transaction refuses it with 25P02)."""
        self._aborted_at = None
        if self.is_closed() or not self._conn.is_in_transaction():
            return
        # Anything else (a dead connection, a second cancellation of a caller on its way
        # out already) leaves nothing to find out.
        with contextlib.suppress(Exception, asyncio.CancelledError):
            try:
                await self._conn.execute(sql.CHANGES_NOTHING)
            except asyncpg.PostgresError as exc:
                if sql.meaning(self.sqlstate(exc)) is sql.Meaning.TRANSACTION_FAILED:
                    self._aborted_at = self._queries()

    def _password(self) -> str | None:
        password = private.parameters(self._conn).password
        # asyncpg also takes a function that returns it: nothing to blank then.
        return password if isinstance(password, str) and password else None


def _sqlstate(exc: BaseException) -> str | None:
    if isinstance(exc, asyncpg.PostgresError):
        state = getattr(exc, "sqlstate", None)
        return str(state) if state else None
    return None


def _ssl_of(params: Any) -> object:
    """The ``ssl=`` that connects the way ``params`` did: a mode that may fall back to
    plain text by its name (its context alone would insist on TLS), else the context."""
    mode = getattr(params.sslmode, "name", None)
    return mode if mode in ("disable", "allow", "prefer") else params.ssl


def _failed_transaction() -> TransactionFailedError:
    return TransactionFailedError(
        "the transaction pgsolo opened for a transaction lock failed inside the block (an"
        " error was caught there and not re-raised); it was rolled back and nothing committed"
    )


class Checkout:
    """One checkout of a connection from its pool (a connection of no pool has one): what
    pgsolo keeps its books by (:attr:`AsyncpgDriver.connection`). ``Pool.release()`` runs
    ``pg_advisory_unlock_all()``, so what an earlier checkout held is gone: the next one
    starts with clean books, and a lock of the earlier one can no longer touch them.

    It sends a lock call alone (:class:`~pgsolo.drivers.AsyncLoneCalls`): one the session
    has prepared, run by asyncpg's protocol, whose awaitable the lock awaits itself."""

    __slots__ = ("__weakref__", "_conn", "caches_statements", "lone", "number", "pid")

    def __init__(self, conn: Any, number: int, caches_statements: bool, pid: int) -> None:
        # Weakly: pgsolo's books of checkouts, by connection, must not keep it alive.
        self._conn = weakref.ref(conn)
        self.number = number
        # Fixed when the connection was made (statement_cache_size=): read once.
        self.caches_statements = caches_statements
        # Its backend's pid (0 if it was closed by then: an aborted connection has no
        # protocol left to ask).
        self.pid = pid
        # The lock calls the session has prepared, by their text, each as its run by
        # name, ready to be called (private.ready_run): what pgsolo.drivers.prepared says
        # of them, kept here too, where a lone call finds it at once (forgotten with
        # prepared's; emptied when full, as a process that locks ever new keys must not
        # keep them all).
        self.lone: dict[str, Callable[[], Awaitable[Rows]]] = {}

    def send(self, statements: Sequence[str]) -> Awaitable[Rows] | None:
        # On the connection idle_pid() found open with no transaction, just now.
        run = self.lone.get(statements[0]) if len(statements) == 1 else None
        return run() if run is not None else None

    def run_by_name(self, call: sql.LockCall, protocol: Any, statement: object) -> Awaitable[Rows]:
        """Run ``call`` by name (``statement``: asyncpg's handle of it, on the open
        ``protocol``), and keep the run to send it alone from now on."""
        run = private.ready_run(protocol, statement, call.prepared.values)
        if len(self.lone) >= _LONE_MAX:
            self.lone.clear()
        self.lone[call] = run
        return run()

    async def resend(self, failure: Exception, statements: Sequence[str]) -> object:
        conn, call = self._conn(), statements[0]
        if conn is not None and type(call) is sql.LockCall and self.forgets(failure):
            return (await _lock_call(conn, call, self))[0][0]
        raise failure

    def forgets(self, failure: Exception) -> bool:
        """Whether a lock call run by name failed because the caller dropped the session's
        prepared statements (DISCARD ALL, which aborts nothing outside a transaction):
        they are forgotten then, and the call is to be sent again, as written."""
        conn = self._conn()
        if conn is None or not prepared.forget(conn, _sqlstate(failure)):
            return False
        self.lone.clear()
        return True


_CHECKOUTS: IdentityWeakMap[Any, Checkout] = IdentityWeakMap()


def _lock_call(conn: Any, call: sql.LoneCall, checkout: Checkout) -> Awaitable[Rows]:
    """A lock call alone, which changes no transaction and ends on the server at once; the
    rows it answers (one, of one value). A cancellation is asyncpg's to handle (it asks
    the server to cancel the statement, and its next operation waits until the server
    answered: pgsolo's recovery then finds out what the call did). A guarded call (behind
    a proxy) is sent as written. An unguarded one, outside a transaction, once it ran
    :data:`PREPARE_AFTER` times on the connection, is prepared there
    (:mod:`pgsolo.drivers.prepared`) unless the caller turned asyncpg's statement cache
    off (``checkout.caches_statements`` False: ``statement_cache_size=0``, as behind a
    transaction-pooling proxy), and, run by name, kept in ``checkout.lone`` to be sent
    alone from then on (:meth:`Checkout.send`). Prepared, it is asyncpg's own
    round trip; if the session no longer has it, the caller sends it again. On a closed
    connection it is sent as written, which raises asyncpg's own error."""
    if type(call) is not sql.LockCall:
        return _call_as_written(conn, call)
    protocol = private.open_protocol(conn)
    if protocol is not None and checkout.caches_statements and not protocol.is_in_transaction():
        form = call.prepared
        how, statement = prepared.how(conn, form.name, PREPARE_AFTER)
        if how is prepared.PREPARE:
            return _prepared_call(conn, call, checkout)
        if how is prepared.BY_NAME:
            return checkout.run_by_name(call, protocol, statement)
    return _call_as_written(conn, call)


async def _prepared_call(conn: Any, call: sql.LockCall, checkout: Checkout) -> Rows:
    """Prepare ``call`` on the session, then run it by name (as written if that failed)."""
    form = call.prepared
    try:
        made = await conn.prepare(form.template.decode("ascii"))
    except asyncpg.PostgresError as exc:
        how, statement = prepared.made(conn, form.name, _sqlstate(exc))
    else:
        how, statement = prepared.made(conn, form.name, None, private.kept_statement(made))
    protocol = private.open_protocol(conn)  # closed meanwhile: as written raises
    if how is prepared.BY_NAME and protocol is not None:
        return await checkout.run_by_name(call, protocol, statement)
    return await _call_as_written(conn, call)


async def _call_as_written(conn: Any, call: sql.LoneCall) -> Rows:
    """``call`` as a simple query, its answer read from the row count of its rewrite."""
    tag = str(await conn.execute(sql.truth_by_count(call)))
    return [(sql.TRUTH_BY_COUNT[int(tag.rpartition(" ")[2])],)]


def _shielded(conn: Any, exchange: Coroutine[Any, Any, T]) -> Awaitable[T]:
    """``exchange``, out of reach of the caller's cancellation, in the caller's own task
    (:mod:`._in_place`: a task of its own per round trip cost more than the rest of an
    asyncpg transaction lock's Python): a cancellation that reached asyncpg's COPY-out
    waiter can make its protocol set a result on the waiter it had just cancelled, and
    close the connection; and asyncpg asks the server once to cancel a statement, where a
    request that arrives between two statements of a message is ignored and a wait would
    go on. If the caller is cancelled, :func:`_settle` cancels the statement on the
    server and lets the exchange end first."""
    return awaited_in_place(exchange, functools.partial(_settle, conn))


async def _settle(conn: Any, block: asyncio.Future[Any]) -> None:
    """Bring an interrupted exchange to its end, bounded: ask the server to cancel its
    statement (again every quarter of a second: a request that arrives between two
    statements of the message is ignored), each request delivered before the next look,
    so that none lands on a later statement. Past the bound, the exchange is cancelled
    the way asyncpg does it, and the connection closed. Further cancellations of the
    caller are absorbed: it is on its way out with one."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + _SETTLE_SECONDS
    gave_up = False
    while not block.done():
        if loop.time() < give_up:
            delivered = loop.create_future()
            with contextlib.suppress(Exception):
                private.cancel_statement(conn, delivered)
            # Delivered, though the caller is cancelled again meanwhile: a request still on
            # its way when the exchange ends would cancel the caller's next statement.
            while not delivered.done() and (left := give_up - loop.time()) > 0:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({delivered}, timeout=left)
        else:
            gave_up = True
            block.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({block}, timeout=0.25)
    if gave_up and not conn.is_closed():
        # asyncpg may still wait for the server to acknowledge its own cancellation, and
        # would refuse the caller's next statement (another operation is in progress);
        # what the server did meanwhile, a lock granted say, is unknown. Closed, the
        # connection holds nothing, and says so.
        conn.terminate()
    if not block.cancelled():
        block.exception()  # retrieved: the caller's cancellation is what propagates


async def _exchange_once(conn: Any, statements: Sequence[str]) -> tuple[str, object]:
    last = max((i for i, s in enumerate(statements) if sql.returns_rows(s)), default=None)
    if last is None:
        return str(await conn.execute("; ".join(statements))), None
    if last == len(statements) - 1 and isinstance(truth := statements[last], sql.Truth):
        # A truth value: the row count of a plain SELECT carries it, without a COPY's
        # cost on the server (a fifth of a session lock and unlock over a local socket).
        counted = sql.truth_by_count(truth)
        tag = str(await conn.execute("; ".join([*statements[:last], counted])))
        return tag, sql.TRUTH_BY_COUNT[int(tag.rpartition(" ")[2])]
    copy = (
        f"COPY (WITH pgsolo_value AS ({statements[last]})"
        " SELECT pg_typeof(v)::text, v FROM pgsolo_value AS pgsolo_row(v)) TO STDOUT"
    )
    script = "; ".join([*statements[:last], copy, *statements[last + 1 :]])
    chunks: list[bytes] = []

    async def sink(data: bytes) -> None:
        chunks.append(bytes(data))

    tag = await private.copy_out(conn, script, sink)
    return tag, _read_copy_row(b"".join(chunks))


def _read_copy_row(data: bytes) -> object:
    """The value of the first row COPY sent as text (``type<TAB>value``), as psycopg reads
    that type; None for no row or NULL."""
    line = data.partition(b"\n")[0]
    if not line:
        return None
    kind, _, raw = line.decode("utf-8").partition("\t")
    if raw == "\\N":
        return None
    text = _unescape(raw)
    if kind == "boolean":
        return text == "t"
    if kind in ("smallint", "integer", "bigint", "oid"):
        return int(text)
    if kind == "bytea":
        return bytes.fromhex(text[2:])  # hex output: \x...
    return text


_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def _unescape(raw: str) -> str:
    """A COPY text field without its backslash escapes (COPY TO writes only these)."""
    if "\\" not in raw:
        return raw
    out: list[str] = []
    chars = iter(raw)
    for char in chars:
        out.append(_ESCAPES.get(next(chars, ""), "") if char == "\\" else char)
    return "".join(out)
