"""psycopg2 connections: every lock API takes them, on a real server.

psycopg2 keeps only the result of the last statement of a message, so pgsolo splits a
message whose value comes before a COMMIT or RELEASE SAVEPOINT; these tests guard that
each lock still reads its answer (acquired, busy, a fencing token), that a transaction
lock follows the transaction the caller is in, and that an interrupted wait leaves
nothing held or waiting.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.extras
import pytest

import pgsolo
from _support import WORK, Boom, Connect, eventually, new_job, work_rows
from pgsolo import Key, session_lock, xact_lock
from pgsolo.drivers import TxStatus, adapt, driver_errors, is_unavailable
from pgsolo.drivers._psycopg2 import split_trailing


@pytest.fixture
def connect2(dsn: str) -> Iterator[Any]:
    """Open psycopg2 connections (autocommit unless asked otherwise); closed afterwards."""
    opened: list[Any] = []

    def _open(*, autocommit: bool = True, **kwargs: Any) -> Any:
        conn = psycopg2.connect(dsn, **kwargs)
        conn.autocommit = autocommit
        opened.append(conn)
        return conn

    yield _open
    for conn in opened:
        conn.close()


def insert(conn: Any, job: str, note: str) -> None:
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


def test_only_the_last_statement_of_a_message_returns_rows(connect2: Any) -> None:
    """Guards the reason for the split: psycopg2 drops the rows of a SELECT followed by
    a COMMIT in the same execute(), and pgsolo cuts the message after the SELECT."""
    with connect2().cursor() as cur:
        cur.execute("BEGIN; SELECT 42; COMMIT")
        assert cur.description is None
    assert split_trailing(["BEGIN", "SELECT 1", "COMMIT"]) == (["BEGIN", "SELECT 1"], ["COMMIT"])
    assert split_trailing(["SELECT 1", "SELECT 2"]) == (["SELECT 1", "SELECT 2"], [])
    assert split_trailing(["COMMIT"]) == ([], ["COMMIT"])


@pytest.mark.parametrize("lifetime", ["session", "xact"])
@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
def test_try_wait_busy_and_timeout(
    connect2: Any, connect: Connect, observer: Any, key: Key, lifetime: str, autocommit: bool
) -> None:
    factory = session_lock if lifetime == "session" else xact_lock
    conn = connect2(autocommit=autocommit)
    for wait in (None, 5.0):
        with factory(conn, key, wait=wait) as lock:
            assert lock.acquired
            assert observer.holders(key) == {conn.info.backend_pid}
        if not autocommit:
            conn.commit()  # an xact lock joined the caller's implicit transaction
        assert observer.holders(key) == set()
    holder = session_lock(connect(), key)
    assert holder.acquire()
    with factory(conn, key) as lock:
        assert not lock.acquired
    with pytest.raises(pgsolo.LockTimeoutError), factory(conn, key, wait=0.2):
        pass
    if not autocommit:
        conn.rollback()
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    assert observer.waiters(key) == set()
    holder.release()


def test_session_lock_inside_the_callers_transaction_reads_its_answers(
    connect2: Any, connect: Connect, observer: Any, key: Key
) -> None:
    """The savepoint's RELEASE comes after the lock's value: both the try and the
    unlock must still be read (busy is False, a release of a lost lock is reported)."""
    conn = connect2(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("SELECT 1")
    lock = session_lock(conn, key)
    assert lock.acquire()
    conn.rollback()  # the session lock outlives the caller's transaction
    assert observer.holders(key) == {conn.info.backend_pid}
    with conn.cursor() as cur:
        cur.execute("SELECT 1")
    lock.release()
    assert observer.holders(key) == set()
    conn.rollback()
    holder = session_lock(connect(), key)
    assert holder.acquire()
    with conn.cursor() as cur:
        cur.execute("SELECT 1")
    assert not session_lock(conn, key).acquire()
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_INTRANS


@pytest.mark.usefixtures("db")
def test_a_failed_block_rolled_back_before_the_unlock_leaves_psycopg2_in_step(
    connect2: Any, observer: Any, key: Key
) -> None:
    """Regression: a session lock taken outside any transaction, whose block failed in
    the transaction psycopg2 began, is released after a ROLLBACK. Sent as a statement,
    that ROLLBACK left psycopg2's own book saying the transaction was open, so psycopg2
    sent no BEGIN again: the caller's next statements ran without a transaction (each
    committed at once, past the caller's rollback), and without the connection's
    isolation level."""
    job = new_job("psycopg2-failed-block")
    conn = connect2(autocommit=False)
    conn.set_session(isolation_level="SERIALIZABLE")
    with pytest.raises(psycopg2.errors.DivisionByZero):
        fail_in_session_lock(conn, key)
    assert observer.holders(key) == set()
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
    insert(conn, job, "rolled back by the caller")
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    with conn.cursor() as cur:
        cur.execute("SHOW transaction_isolation")
        assert cur.fetchone() == ("serializable",)
    conn.rollback()
    assert work_rows(observer, job) == []


@pytest.mark.usefixtures("db")
def test_xact_lock_joins_the_callers_transaction_and_its_rollback(
    connect2: Any, observer: Any, key: Key
) -> None:
    """Regression: the lock inside the caller's transaction must not commit it; the
    caller's rollback undoes the block's rows and releases the lock."""
    job = new_job("psycopg2-join")
    conn = connect2(autocommit=False)
    with xact_lock(conn, key, wait=5) as lock:
        assert lock.acquired
        insert(conn, job, "in-block")
    assert observer.holders(key) == {conn.info.backend_pid}  # until the caller ends it
    conn.rollback()
    assert observer.holders(key) == set()
    assert work_rows(observer, job) == []


@pytest.mark.usefixtures("db")
def test_own_transaction_commits_with_the_block_or_rolls_back(
    connect2: Any, observer: Any, key: Key
) -> None:
    job = new_job("psycopg2-own")
    conn = connect2()
    with xact_lock(conn, key, wait=5):
        insert(conn, job, "committed")
    with pytest.raises(Boom):
        with_lock(conn, key, raise_boom, job)
    assert work_rows(observer, job) == ["committed"]
    assert observer.holders(key) == set()
    assert adapt(conn).transaction_status() is TxStatus.IDLE


@pytest.mark.usefixtures("db")
@pytest.mark.parametrize("lifetime", ["session", "xact"])
@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
def test_fencing_tokens_increase(
    connect2: Any, key: Key, lifetime: str, wait: float | None
) -> None:
    factory = session_lock if lifetime == "session" else xact_lock
    tokens = []
    for autocommit in (True, False, True):
        conn = connect2(autocommit=autocommit)
        with factory(conn, key, wait=wait, fencing=True) as lock:
            assert lock.token is not None
            tokens.append(lock.token)
        conn.commit()
    assert tokens == sorted(set(tokens))


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_excludes_a_psycopg3_holder_both_ways(
    connect2: Any, connect: Connect, key: Key, lifetime: str
) -> None:
    factory = session_lock if lifetime == "session" else xact_lock
    old, new = connect2(), connect()
    with factory(old, key) as held:
        assert held.acquired
        with factory(new, key) as other:
            assert not other.acquired
    with factory(new, key) as held:
        assert held.acquired
        with factory(old, key) as other:
            assert not other.acquired


@pytest.mark.usefixtures("db")
def test_run_job_owns_its_transaction(connect2: Any, observer: Any) -> None:
    job = new_job("psycopg2-job")
    result = pgsolo.run_job(connect2(), job, lambda conn: insert(conn, job, "done"))
    assert result.outcome == "completed"
    with pytest.raises(Boom):
        pgsolo.run_job(connect2(autocommit=False), job, raise_boom, job)
    assert work_rows(observer, job) == ["done"]


def with_lock(conn: Any, key: Key, fn: Any, *args: Any) -> None:
    with xact_lock(conn, key):
        fn(conn, *args)


def fail_in_session_lock(conn: Any, key: Key) -> None:
    """A statement of the block fails, in the transaction psycopg2 began for it."""
    with session_lock(conn, key) as lock:
        assert lock.acquired
        with conn.cursor() as cur:
            cur.execute("SELECT 1/0")


def raise_boom(conn: Any, job: str) -> None:
    insert(conn, job, "x")
    raise Boom


def test_unsupported_objects_and_keep_are_refused(connect2: Any, key: Key) -> None:
    conn = connect2()
    with pytest.raises(pgsolo.UnsupportedConnectionError):
        xact_lock(conn.cursor(), key)
    with pytest.raises(pgsolo.UsageError, match="psycopg2"):
        session_lock(conn, key, keep=True)


def test_errors_and_status_read_from_psycopg2(connect2: Any, dsn: str) -> None:
    conn = connect2(autocommit=False)
    driver = adapt(conn)
    assert driver.begins_implicitly
    assert psycopg2.Error in driver_errors()
    with pytest.raises(psycopg2.Error) as failed, conn.cursor() as cur:
        cur.execute("SELECT 1/0")
    assert driver.sqlstate(failed.value) == "22012"
    assert not is_unavailable(failed.value)
    assert driver.transaction_status() is TxStatus.INERROR
    conn.rollback()
    assert driver.server_info().user
    assert driver.fetch_value_elsewhere(["SELECT pg_backend_pid()"]) != driver.backend_pid()
    pid = driver.backend_pid()
    conn.close()
    assert driver.is_closed()
    assert driver.backend_pid() == pid
    assert driver.transaction_status() is TxStatus.UNKNOWN
    with psycopg.connect(dsn) as probe:  # the caller's psycopg 3 errors are still known
        assert psycopg.Error in driver_errors()
        assert probe.closed is False


@pytest.mark.parametrize("wait_callback", [False, True], ids=["default", "wait_select"])
def test_keyboard_interrupt_during_a_wait_leaves_nothing_held(
    connect2: Any, connect: Connect, observer: Any, key: Key, wait_callback: bool
) -> None:
    """Ctrl-C during a lock wait: psycopg2 raises it once the wait ends (by default) or
    cancels the wait at once (with wait_select); either way the lock is not held and
    nobody waits afterwards."""
    conn = connect2()
    holder = session_lock(connect(), key)
    assert holder.acquire()
    pid = conn.info.backend_pid
    main = threading.get_ident()

    def interrupt_then_release() -> None:
        eventually(lambda: observer.waiters(key) == {pid}, "the wait began")
        signal.pthread_kill(main, signal.SIGINT)  # as Ctrl-C would
        if not wait_callback:
            holder.release()  # the wait ends, granted

    if wait_callback:
        psycopg2.extensions.set_wait_callback(psycopg2.extras.wait_select)
    thread = threading.Thread(target=interrupt_then_release)
    try:
        thread.start()
        # wait_select turns Ctrl-C into a cancel request: the wait ends with QueryCanceled.
        raised = psycopg2.errors.QueryCanceled if wait_callback else KeyboardInterrupt
        with pytest.raises(raised), session_lock(conn, key, wait=30):
            pytest.fail("the lock was taken despite the interruption")  # pragma: no cover
    finally:
        thread.join()
        psycopg2.extensions.set_wait_callback(None)
    assert observer.waiters(key) == set()
    assert pid not in observer.holders(key)
    assert conn.info.transaction_status == psycopg2.extensions.TRANSACTION_STATUS_IDLE
