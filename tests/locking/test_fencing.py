"""Fencing tokens: each acquisition of a key yields a larger token than any before it,
issued by the database in the same round trip (or transaction) as the lock, so that a
downstream system can refuse the writes of a holder whose lock was lost."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import eventually, terminate
from pgsolo import Key, UsageError

Connect = Callable[..., psycopg.Connection[Any]]


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
