"""Edge cases of session locks found in review (fencing, the keeper, the proxy guard);
each is a regression test on a real server."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import _support
import pgsolo
from _relay import FreezingProxy
from _support import eventually
from pgsolo import Key

Connect = Callable[..., psycopg.Connection[Any]]


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


def _hog_descriptors(count: int = 1100) -> list[int]:

    return [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]


def test_keeper_works_on_a_connection_whose_descriptor_is_above_1023(
    connect: Connect, observer: Any, key: Key
) -> None:
    """select.select() cannot watch a descriptor >= FD_SETSIZE (1024); a process with
    many open files (a busy web server) gets such connections."""

    hogs = _hog_descriptors()
    try:
        conn = connect()
        assert conn.fileno() >= 1024
        lock = pgsolo.session_lock(conn, key, keep=pgsolo.Keep(interval=0.05, timeout=2))
        assert lock.acquire()
        time.sleep(0.5)  # several beats
        # The user's connection must still work after the keeper's beats...
        assert conn.execute("SELECT 42").fetchone() == (42,)
        # ...and the keeper must still see a loss.
        _support.terminate(observer, conn.info.backend_pid)
        _support.eventually(lambda: lock.lost, "the keeper to notice")
    finally:
        for fd in hogs:
            os.close(fd)


def test_a_timed_out_beat_never_shuts_down_a_socket_it_no_longer_owns(
    dsn: str, key: Key, connect: Connect
) -> None:
    """The connection is closed while a beat waits for a frozen server; the descriptor
    number is reused by the next connection. The beat's deadline must not shut that one."""

    with FreezingProxy(dsn) as relay:
        conn = psycopg.connect(relay.dsn, autocommit=True)
        lock = pgsolo.session_lock(conn, key, keep=pgsolo.Keep(interval=0.05, timeout=1.5))
        assert lock.acquire()
        number = conn.fileno()
        relay.freeze()
        time.sleep(0.3)  # a beat is now waiting for the frozen server
        conn.close()
        bystander = connect()
        if bystander.fileno() != number:
            pytest.skip("the descriptor number was not reused")
        time.sleep(2.5)  # past the beat's deadline
        assert bystander.execute("SELECT 1").fetchone() == (1,)


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


def test_beats_during_a_users_pipeline_neither_fail_nor_disturb_it(
    connect: Connect, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    conn = connect()
    lock = pgsolo.session_lock(conn, key, keep=pgsolo.Keep(interval=0.01))
    assert lock.acquire()
    with caplog.at_level("WARNING", logger="pgsolo"):
        deadline = time.monotonic() + 0.6
        results = []
        with conn.pipeline() as pipeline:
            while time.monotonic() < deadline:
                cur = conn.execute("SELECT 7")
                pipeline.sync()
                results.append(cur.fetchone())
                time.sleep(0.005)  # the pipeline is idle (synced) but still on
        assert set(results) == {(7,)}
        time.sleep(0.1)
    assert not lock.lost
    assert [r.getMessage() for r in caplog.records] == []
    lock.release()


def test_release_of_a_reentrant_hold_after_a_loss_raises_the_loss(
    connect: Connect, key: Key
) -> None:
    """README: after a loss, 'release() raises it'. An inner re-entrant hold's release
    only decrements a counter and returns quietly."""

    conn = connect()
    keep = pgsolo.Keep(interval=0.02)
    outer = pgsolo.session_lock(conn, key, reentrant=True, keep=keep)
    inner = pgsolo.session_lock(conn, key, reentrant=True, keep=keep)
    assert outer.acquire()
    assert inner.acquire()
    conn.execute("SELECT pg_advisory_unlock_all()")  # gone behind pgsolo's back
    eventually(lambda: inner.lost and outer.lost, "both keepers to notice")
    with pytest.raises(pgsolo.LockLostError):
        inner.release()


def test_reset_all_behind_a_relay_does_not_strand_a_held_lock(
    dsn: str, observer: Any, key: Key
) -> None:
    """RESET ALL keeps advisory locks but wipes pgsolo's session stamp; behind a proxy the
    guarded unlock then believes the connection moved, forgets the lock and leaves it held
    on this very (live) session."""

    with FreezingProxy(dsn) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
        lock = pgsolo.session_lock(conn, key)
        assert lock.acquire()
        conn.execute("RESET ALL")
        try:
            lock.release()
        finally:
            held = observer.holders(key)
            forgotten = pgsolo.held_session_locks(conn) == []
        assert held == set(), f"still held by {held}; pgsolo forgot it: {forgotten}"
