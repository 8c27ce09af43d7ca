"""Ctrl-C during a wait leaves nothing behind on every sync kind of connection: a real
SIGINT to this process while its main thread waits on the server for a key held
elsewhere. Nothing is held or waiting afterwards, and the connection (and the caller's
transaction, when the lock was waiting in it) is usable. psycopg 3 cancels the wait at
once; psycopg2 lets the interruption through only when the wait ends (test_psycopg2.py),
so its wait here is short. Task cancellation, the async counterpart, is in
test_cancelled_waits.py."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import psycopg
import pytest

import pgsolo
from _drivers import SYNC_KINDS, Kind
from _support import DEADLINE, Connect
from pgsolo import Key


def interrupt_once_waiting(dsn: str, key: Key) -> threading.Thread:
    """A thread that sends SIGINT to this process once a backend waits for ``key``."""
    main = threading.main_thread().ident
    assert main is not None

    def watch() -> None:
        with psycopg.connect(dsn, autocommit=True) as watcher:
            classid, objid = key.value if isinstance(key.value, tuple) else (None, None)
            deadline = time.monotonic() + DEADLINE
            while time.monotonic() < deadline:
                row = watcher.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND NOT granted AND classid::bigint = %s AND objid::bigint = %s",
                    (classid, objid),
                ).fetchone()
                if row and row[0]:
                    signal.pthread_kill(main, signal.SIGINT)
                    return
                time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("in_callers_transaction", [False, True], ids=["own", "callers"])
@pytest.mark.parametrize("kind", SYNC_KINDS, ids=str)
def test_ctrl_c_during_a_wait_leaves_nothing_behind(
    kind: Kind,
    in_callers_transaction: bool,
    db: str,
    observer: Any,
    key: Key,
    connect: Connect,
) -> None:
    assert isinstance(key.value, tuple)
    holder = pgsolo.session_lock(connect(), key)
    assert holder.acquire()
    joined = in_callers_transaction or kind.implicit
    wait = 3 if kind.keeper else 1  # psycopg2 lets Ctrl-C through when the wait ends
    with kind.open(db) as conn:
        if in_callers_transaction:
            conn.begin()
        lock = (
            pgsolo.xact_lock(conn.conn, key, wait=wait)
            if joined or not kind.session_locks
            else pgsolo.session_lock(conn.conn, key, wait=wait)
        )
        watcher = interrupt_once_waiting(db, key)
        with pytest.raises(KeyboardInterrupt), lock:
            pytest.fail("entered a block whose key is held elsewhere")
        watcher.join(DEADLINE)
        assert observer.waiters(key) == set()
        if joined:
            assert conn.in_transaction()
            conn.execute("SELECT 1")  # the caller's transaction is still usable
            conn.rollback()
        assert not conn.in_transaction()
        holder.release()
        assert observer.holders(key) == set()
        with pgsolo.xact_lock(conn.conn, key, wait=5) as again:
            assert again.acquired
        if kind.implicit:
            conn.rollback()
    assert observer.holders(key) == set()
