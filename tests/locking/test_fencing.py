"""Fencing tokens: each acquisition of a key yields a larger token than any before it,
issued by the database in the same round trip (or transaction) as the lock, so that a
downstream system can refuse the writes of a holder whose lock was lost.

Also: the token of this very acquisition inside a caller's transaction, no stale token
on a busy retry, and fencing that never acquires without a token nor waits for another
session's transaction.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import Connect, eventually, terminate
from pgsolo import Key, UsageError, session_lock, xact_lock


def last_issued(observer: Any) -> int:
    """The last token the sequence handed out, to anyone."""
    row = observer.conn.execute("SELECT last_value FROM pgsolo.fencing_token_seq").fetchone()
    assert row is not None
    return int(row[0])


def acquire_token(
    conn: psycopg.Connection[Any], key: Key, lifetime: str, wait: float | None
) -> int:
    if lifetime == "session":
        with pgsolo.session_lock(conn, key, wait=wait, fencing=True) as lock:
            assert lock.acquired
            assert lock.token is not None
            return lock.token
    with pgsolo.xact_lock(conn, key, wait=wait, fencing=True) as lock:
        assert lock.acquired
        assert lock.token is not None
    if not conn.autocommit:  # the lock joined the caller's implicit transaction
        conn.commit()
    return lock.token


@pytest.mark.usefixtures("db")
@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
@pytest.mark.parametrize("lifetime", ["session", "xact"])
@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-tx"])
def test_tokens_increase_with_every_acquisition_from_any_connection(
    connect: Connect,
    observer: Any,
    key: Key,
    lifetime: str,
    wait: float | None,
    autocommit: bool,
) -> None:
    conns = [connect(autocommit=autocommit) for _ in range(3)]
    tokens = [acquire_token(conns[i % 3], key, lifetime, wait) for i in range(6)]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == len(tokens)
    assert last_issued(observer) >= tokens[-1]
    for conn in conns:
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert observer.holders(key) == set()


@pytest.mark.usefixtures("db")
def test_no_token_when_busy_and_none_consumed(connect: Connect, observer: Any, key: Key) -> None:
    holder = pgsolo.session_lock(connect(), key, fencing=True)
    assert holder.acquire()
    first = holder.token
    issued = last_issued(observer)
    busy = pgsolo.session_lock(connect(), key, fencing=True)
    assert not busy.acquire()
    assert busy.token is None
    with pgsolo.xact_lock(connect(), key, fencing=True) as xact:
        assert not xact.acquired
        assert xact.token is None
    assert first == issued
    assert last_issued(observer) == issued  # a busy try takes no token
    holder.release()


@pytest.mark.usefixtures("db")
def test_a_rolled_back_acquisition_never_hands_its_token_out_again(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    lock = pgsolo.xact_lock(conn, key, fencing=True)
    tokens: list[int | None] = []

    def failing_work() -> None:
        with lock:
            tokens.append(lock.token)
            raise ZeroDivisionError  # the work fails; the transaction is rolled back

    with pytest.raises(ZeroDivisionError):
        failing_work()
    [rolled_back] = tokens
    assert rolled_back is not None
    assert acquire_token(conn, key, "xact", None) > rolled_back  # never handed out again


@pytest.mark.usefixtures("db")
def test_threads_racing_get_distinct_tokens_in_the_order_they_held_the_lock(
    connect: Connect, key: Key
) -> None:
    held_in_order: list[int] = []
    order_lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            conn = connect()
            for _ in range(10):
                with pgsolo.session_lock(conn, key, wait=30, fencing=True) as lock:
                    assert lock.token is not None
                    with order_lock:
                        held_in_order.append(lock.token)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert len(held_in_order) == 40
    assert held_in_order == sorted(held_in_order)
    assert len(set(held_in_order)) == 40


@pytest.mark.usefixtures("db")
def test_a_stale_holder_is_fenced_off_downstream(connect: Connect, observer: Any, key: Key) -> None:
    """The README's scenario: worker A loses its lock (its session is terminated) while it
    still believes it works; B takes over and writes; A's late write is rejected because
    its token is smaller than the one the downstream store has seen."""
    store = observer.conn
    store.execute(
        "CREATE TEMP TABLE documents (id int PRIMARY KEY, body text, fence bigint NOT NULL)"
    )
    store.execute("INSERT INTO documents VALUES (1, 'original', 0)")

    def write(body: str, token: int) -> bool:
        row = store.execute(
            "UPDATE documents SET body = %s, fence = %s WHERE id = 1 AND fence < %s RETURNING true",
            (body, token, token),
        ).fetchone()
        return row is not None

    a = pgsolo.session_lock(connect(), key, fencing=True, keep=pgsolo.Keep(interval=0.05))
    assert a.acquire()
    assert a.token is not None
    assert a.backend_pid is not None
    terminate(observer, a.backend_pid)
    with pgsolo.session_lock(connect(), key, wait=10, fencing=True) as b:
        assert b.token is not None
        assert b.token > a.token
        assert write("written by B", b.token)
    assert not write("late write by A", a.token)  # fenced off
    assert store.execute("SELECT body FROM documents").fetchone() == ("written by B",)
    eventually(lambda: a.lost, "A's keeper to notice")
    with pytest.raises(pgsolo.LockLostError):
        a.release()


def test_fencing_before_migrate_is_a_clear_error_and_holds_nothing(
    fresh_db: str, observer: Any, key: Key
) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        for lifetime in ("session", "xact"):
            lock = (
                pgsolo.session_lock(conn, key, fencing=True)
                if lifetime == "session"
                else pgsolo.xact_lock(conn, key, fencing=True)
            )
            with pytest.raises(UsageError, match="pgsolo migrate"), lock:
                pytest.fail("the block ran without a token")
            assert pgsolo.held_session_locks(conn) == []
            assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
            rows = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s",
                (conn.info.backend_pid,),
            ).fetchone()
            assert rows == (0,)


@pytest.mark.parametrize(
    "options",
    [{"shared": True}, {"reentrant": True}, {"fencing": 1}],
    ids=["shared", "reentrant", "not-a-bool"],
)
def test_fencing_with_shared_or_reentrant_is_refused_before_any_sql(
    connect: Connect, observer: Any, key: Key, options: dict[str, Any]
) -> None:
    conn = connect()
    conn.close()  # any SQL would fail with a driver error, not a UsageError
    with pytest.raises(UsageError):
        pgsolo.session_lock(conn, key, **{"fencing": True, **options})
    assert observer.holders(key) == set()


# -- a keeper task when the event loop closes ----------------------------------------------


@pytest.mark.parametrize("autocommit", [True, False])
def test_fencing_wait_in_callers_transaction_returns_this_acquisitions_token(
    db: str, key: Any, autocommit: bool
) -> None:
    """Inside the caller's transaction a fencing acquisition returns the token issued for it
    (the sequence's ``currval`` right after), whatever other sessions took meanwhile, and a
    later one a larger token; a busy fencing try there gets none."""
    with psycopg.connect(db, autocommit=autocommit) as conn, psycopg.connect(db) as other:
        other.execute("SELECT nextval('pgsolo.fencing_token_seq')")  # another session's token
        with conn.transaction():
            lock = xact_lock(conn, key, wait=5, fencing=True)
            assert lock.acquire()
            first = lock.token
            session = session_lock(conn, f"{key.text}-session", wait=5, fencing=True)
            assert session.acquire()
            second = session.token
            current = conn.execute("SELECT currval('pgsolo.fencing_token_seq')").fetchone()
            assert current == (second,)
            session.release()
        assert first is not None
        assert second is not None
        assert second > first
        # a busy fencing try answers 0: not acquired, no token
        other.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        with conn.transaction():
            busy = xact_lock(conn, key, fencing=True)
            assert busy.acquire() is False
            assert busy.token is None
            assert not busy.acquired


def test_a_busy_retry_does_not_show_the_previous_acquisitions_token(db: str, key: Any) -> None:
    """A session Lock object used again after its release finds the key busy: it holds
    nothing and was issued no token, so ``lock.token`` must be None, not the token of the
    earlier, released hold (which a downstream system would still accept)."""
    with (
        psycopg.connect(db, autocommit=True) as conn,
        psycopg.connect(db, autocommit=True) as other,
    ):
        lock = session_lock(conn, key, fencing=True)
        assert lock.acquire()
        old = lock.token
        lock.release()
        other.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        assert lock.acquire() is False  # busy: nothing held, no token issued
        assert lock.token is None, f"busy try still shows token {old} of a released hold"


# -- found in review -----------------------------------------------------------------------


def _fencing_row_locked_by_open_transaction(connect: Connect, key: Key) -> psycopg.Connection[Any]:
    """Worker A takes and releases the key inside a transaction it keeps open (an earlier
    design kept a row per key, which A's open transaction then held locked)."""
    a = connect()
    a.execute("BEGIN")
    lock = pgsolo.session_lock(a, key, fencing=True)
    assert lock.acquire()
    assert lock.token is not None
    lock.release()  # the advisory lock is free now; A's transaction is still open
    return a


@pytest.mark.usefixtures("db")
def test_wait_with_fencing_never_acquires_without_a_token(
    connect: Connect, observer: Any, key: Key
) -> None:
    """Another session took and released the key inside a transaction it keeps open (an
    earlier design kept a fencing row per key, which that transaction held locked): a fencing
    wait must fail or acquire with a token, never report the lock acquired without one."""
    a = _fencing_row_locked_by_open_transaction(connect, key)
    b = connect()
    lock = pgsolo.session_lock(b, key, wait=1, fencing=True)
    try:
        acquired = lock.acquire()
    except pgsolo.LockTimeoutError:
        acquired = False
    # Acquired with fencing=True must mean a token (never "granted as it timed out"
    # without one).
    assert not acquired or lock.token is not None, (acquired, lock.token)
    if lock.acquired:
        lock.release()
    a.execute("ROLLBACK")


@pytest.mark.usefixtures("db")
def test_try_with_fencing_does_not_wait_for_another_transaction(
    connect: Connect, observer: Any, key: Key
) -> None:
    """The same setup, with a try: the key is free, so the fencing try must answer at once,
    acquired and with a token, never wait for the other session's open transaction."""
    a = _fencing_row_locked_by_open_transaction(connect, key)
    b = connect()
    b.execute("SET statement_timeout = '3s'")  # bounds the test if the try waits
    lock = pgsolo.session_lock(b, key, fencing=True)
    outcome: list[object] = []
    try:
        outcome.append(lock.acquire())
    except psycopg.Error as exc:  # statement_timeout: the try waited for A's transaction
        outcome.append(exc)
    token = lock.token
    a.execute("ROLLBACK")
    if lock.acquired:
        lock.release()
    # A try answers at once (the key is free): acquired, with a token, never cancelled.
    assert outcome == [True], outcome
    assert token is not None


@pytest.mark.parametrize("wait", [None, 2.0], ids=["try", "wait"])
def test_fencing_failure_inside_the_callers_transaction_holds_nothing(
    fresh_db: str, observer: Any, key: Key, wait: float | None
) -> None:
    """Not migrated: the fencing INSERT fails. Inside the caller's transaction, in wait
    mode, it runs after the savepoint was released, so recovery cannot see the grant."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("BEGIN")
        with pytest.raises(pgsolo.UsageError, match="nothing is held"):
            pgsolo.session_lock(conn, key, wait=wait, fencing=True).acquire()
        held = observer.holders(key)
        conn.execute("ROLLBACK")
        assert held == set(), "a session lock was left held after 'nothing is held'"
        assert observer.holders(key) == set()
