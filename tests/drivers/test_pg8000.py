"""pg8000 connections (the DB-API ones Google's Cloud SQL Python Connector hands out): what
the conformance suite does not see of the library's own traps.

pg8000 keeps the rows of every statement of a message, keeps no database name, has no
public transaction status or backend pid, cannot cancel a statement, and breaks if an
exception lands in the middle of its exchange (Ctrl-C arrives as one); these tests guard
how the adapter answers each, and that what pg8000 cannot do is refused or declared, never
a surprise halfway through a lock.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pg8000
import pg8000.dbapi
import pg8000.native
import pytest
from psycopg.conninfo import conninfo_to_dict

import pgsolo
from _drivers import pg8000_options
from _support import DEADLINE, Connect
from pgsolo import Key
from pgsolo.drivers import Lacking, TxStatus, adapt, driver_errors, is_unavailable
from pgsolo.testing import Relay


@pytest.fixture
def connect8(dsn: str) -> Iterator[Callable[..., Any]]:
    """Open pg8000 DB-API connections (autocommit unless asked otherwise); closed after."""
    opened: list[Any] = []

    def _open(*, autocommit: bool = True, at: str = dsn) -> Any:
        conn = pg8000.dbapi.connect(**pg8000_options(at))
        conn.autocommit = autocommit
        opened.append(conn)
        return conn

    yield _open
    for conn in opened:
        with contextlib.suppress(pg8000.dbapi.InterfaceError):
            conn.close()


def test_both_db_api_connections_take_both_lifetimes(
    dsn: str, connect8: Callable[..., Any], observer: Any, key: Key
) -> None:
    """``pg8000.connect`` (its legacy API) and ``pg8000.dbapi.connect`` alike."""
    legacy = pg8000.connect(**pg8000_options(dsn))
    legacy.autocommit = True
    try:
        for conn in (legacy, connect8()):
            pid = adapt(conn).backend_pid()
            with pgsolo.session_lock(conn, key) as lock:
                assert lock.acquired
                assert observer.holders(key) == {pid}
            with pgsolo.xact_lock(conn, key) as lock:
                assert lock.acquired
                assert observer.holders(key) == {pid}
            assert observer.holders(key) == set()
    finally:
        legacy.close()


def test_a_native_connection_and_a_cursor_are_refused_naming_what_is_taken(
    dsn: str, connect8: Callable[..., Any], key: Key
) -> None:
    native = pg8000.native.Connection(**pg8000_options(dsn))
    try:
        with pytest.raises(pgsolo.UnsupportedConnectionError, match="pg8000 DB-API connection"):
            pgsolo.xact_lock(native, key)  # type: ignore[call-overload]
    finally:
        native.close()
    with pytest.raises(pgsolo.UnsupportedConnectionError, match=r"pg8000\.dbapi\.Cursor"):
        pgsolo.xact_lock(connect8().cursor(), key)  # type: ignore[call-overload]


def test_keep_is_refused_before_any_sql_naming_pg8000(
    connect8: Callable[..., Any], observer: Any, key: Key
) -> None:
    conn = connect8()
    assert isinstance(adapt(conn).heartbeat(), Lacking)
    with pytest.raises(pgsolo.UsageError, match="pg8000 connection cannot be shared"):
        pgsolo.session_lock(conn, key, keep=True)
    assert observer.holders(key) == set()


def test_the_value_is_the_last_row_of_the_message(connect8: Callable[..., Any]) -> None:
    """pg8000 keeps the rows of every statement of a message: the value is the last
    one's, as on every other driver, and a message with no row has none."""
    driver = adapt(connect8())
    assert driver.fetch_value(["SELECT 1", "SELECT 'two'", "SET application_name = 'x'"]) == "two"
    assert driver.fetch_value(["SELECT true", "SELECT 7::bigint"]) == 7
    assert driver.fetch_value(["SELECT '\\x41'::bytea"]) == b"A"
    assert driver.fetch_value(["SET application_name = ''"]) is None


def test_errors_and_status_read_from_pg8000(
    connect8: Callable[..., Any], observer: Any, dsn: str
) -> None:
    conn = connect8(autocommit=False)
    driver = adapt(conn)
    assert driver.begins_implicitly
    assert driver.transaction_status() is TxStatus.IDLE
    assert pg8000.dbapi.Error in driver_errors()
    cur = conn.cursor()
    with pytest.raises(pg8000.dbapi.DatabaseError) as failed:
        cur.execute("SELECT 1/0")
    assert driver.sqlstate(failed.value) == "22012"
    assert not is_unavailable(failed.value)
    assert driver.transaction_status() is TxStatus.INERROR
    conn.rollback()
    assert driver.transaction_status() is TxStatus.IDLE
    assert driver.server_info().user == conninfo_to_dict(dsn).get("user")
    assert driver.fetch_value_elsewhere(["SELECT pg_backend_pid()"]) != driver.backend_pid()
    pid = driver.backend_pid()
    assert pid == driver.fetch_value(["SELECT pg_backend_pid()"], edge="commit")
    observer.conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    # pg8000 says "network error", or lets the socket's own error through
    with pytest.raises((pg8000.dbapi.InterfaceError, OSError)):
        driver.fetch_value(["SELECT 1"])
    assert driver.is_closed()
    assert driver.transaction_status() is TxStatus.UNKNOWN
    assert driver.backend_pid() == pid  # what it said while it was open


def test_a_socket_reset_between_round_trips_breaks_the_connection_not_pgsolo(
    connect8: Callable[..., Any], dsn: str
) -> None:
    """Guards the proxy check of a session lock after a reset of the caller's socket
    (found by the chaos suite): pgsolo reads the server's address from the socket, which
    then has no peer, and the socket's own ``OSError`` (ENOTCONN) came out of pgsolo raw,
    from the error message it was writing. The connection is broken, as after a failed
    round trip: its address is what it said while open, and a check elsewhere fails with
    pg8000's own error for a broken socket, which pgsolo reports as unavailable."""
    with Relay(dsn) as relay:
        driver = adapt(connect8(at=relay.dsn))
        assert driver.server_info().host == "127.0.0.1"
        relay.reset()
        deadline = time.monotonic() + DEADLINE
        while not driver.is_closed():  # the reset arrives: the socket loses its peer
            assert time.monotonic() < deadline, "the reset never arrived"
            assert driver.server_info().host == "127.0.0.1"
            time.sleep(0.01)
        with pytest.raises(pg8000.dbapi.InterfaceError, match="network error") as failed:
            driver.fetch_value_elsewhere(["SELECT 1"])
        assert is_unavailable(failed.value)


def test_the_database_name_is_read_once_and_leaves_the_connection_as_found(
    connect8: Callable[..., Any], dsn: str
) -> None:
    """pg8000 keeps no database name: it is asked once, outside a failed transaction,
    without opening a transaction on an ``autocommit=False`` connection."""
    name = conninfo_to_dict(dsn).get("dbname")
    failed = connect8(autocommit=False)
    cur = failed.cursor()
    with pytest.raises(pg8000.dbapi.DatabaseError):
        cur.execute("SELECT 1/0")
    assert adapt(failed).server_info().database == "?"  # only a rollback runs there
    failed.rollback()
    assert adapt(failed).server_info().database == name
    conn = connect8(autocommit=False)
    driver = adapt(conn)
    assert driver.server_info().database == name
    assert driver.transaction_status() is TxStatus.IDLE
    assert conn.autocommit is False


def test_session_lock_through_transaction_pooling_is_refused(
    bouncer: Any, connect8: Callable[..., Any], key: Key
) -> None:
    """The proxy check runs over TCP, with a second pg8000 connection to the same place."""
    conn = connect8(at=bouncer.dsn)
    with pytest.raises(pgsolo.UnsafeConnectionError):
        pgsolo.session_lock(conn, key).acquire()
    with pgsolo.xact_lock(conn, key) as lock:  # a transaction lock is fine
        assert lock.acquired


def test_ctrl_c_during_a_wait_is_raised_once_the_round_trip_ends(
    connect8: Callable[..., Any], connect: Connect, observer: Any, key: Key
) -> None:
    """pg8000 cannot cancel a statement, and an exception in the middle of its exchange
    leaves the connection unusable: a SIGINT during pgsolo's round trip is held until the
    round trip ends (a wait: its slice), then raised; the connection is usable, nothing is
    held or waiting, and Python's handler is back."""
    holder = pgsolo.session_lock(connect(), key)
    assert holder.acquire()
    conn = connect8()
    main = threading.main_thread().ident
    assert main is not None

    def interrupt_once_waiting() -> None:
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline and not observer.waiters(key):
            time.sleep(0.01)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=interrupt_once_waiting, daemon=True)
    thread.start()
    with pytest.raises(KeyboardInterrupt), pgsolo.session_lock(conn, key, wait=1):
        pytest.fail("entered a block whose key is held elsewhere")
    thread.join(DEADLINE)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert observer.waiters(key) == set()
    assert adapt(conn).fetch_value(["SELECT 1"]) == 1  # not left in the middle of a message
    holder.release()
    with pgsolo.session_lock(conn, key) as again:
        assert again.acquired
