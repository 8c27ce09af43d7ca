"""Ctrl-C during a wait leaves nothing behind on every sync kind of connection: a real
SIGINT to this process while its main thread waits on the server for a key held
elsewhere. Nothing is held or waiting afterwards, and the connection (and the caller's
transaction, when the lock was waiting in it) is usable. psycopg 3 cancels the wait at
once; psycopg2 lets the interruption through only when the wait ends (test_psycopg2.py),
so its wait here is short. Task cancellation, the async counterpart, is in
test_cancelled_waits.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgsolo
from _drivers import SYNC_KINDS, Kind
from _support import DEADLINE, Connect, eventually
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


# Waits for the key in argv[2] on a psycopg connection with autocommit off (psycopg's
# default), holding the key in argv[3] there too; says "waiting" first, and at the end
# how the connection came out of a Ctrl-C: open or closed, and the keys its session holds.
WAITER = r"""
import json, sys, psycopg, pgsolo
conn = psycopg.connect(sys.argv[1])
other = pgsolo.session_lock(conn, sys.argv[3])
assert other.acquire()
conn.rollback()  # the implicit transaction of that first lock, ended
print("waiting", flush=True)
try:
    with pgsolo.session_lock(conn, pgsolo.Key.parse(sys.argv[2]), wait=30):
        pass
except KeyboardInterrupt:
    pass
held = None if conn.closed else conn.execute(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
).fetchone()[0]
print(json.dumps({"closed": bool(conn.closed), "held": held}), flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_ctrl_c_as_a_wait_slice_runs_out_leaves_the_connection_open(
    db: str, observer: Any, key: Key, connect: Connect
) -> None:
    """Guards the connection of a Ctrl-C that comes as a slice's lock_timeout fires, on a
    psycopg connection with autocommit off: psycopg's handler of the interrupt got the
    timeout's error raised from its cursor, and closed the connection, with the caller's
    other lock. Made certain here: the waiter is stopped, its slice runs out on the server,
    and then it gets SIGINT and resumes."""
    assert isinstance(key.value, tuple)
    holder = pgsolo.session_lock(connect(), key)
    assert holder.acquire()
    waiter = subprocess.Popen(
        [sys.executable, "-c", WAITER, db, key.text, f"other-{uuid.uuid4().hex}"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert waiter.stdout is not None
        assert waiter.stdout.readline() == "waiting\n"
        backend = eventually(
            lambda: observer.conn.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                " AND classid::bigint = %s AND objid::bigint = %s",
                key.value,
            ).fetchone(),
            "the waiter to wait for the key",
        )[0]
        os.kill(waiter.pid, signal.SIGSTOP)
        eventually(lambda: _state(waiter.pid) == "T", "the waiter to stop")
        eventually(  # the slice's lock_timeout fired, the answer is not read yet
            lambda: observer.conn.execute(
                "SELECT state = 'idle in transaction (aborted)' FROM pg_stat_activity"
                " WHERE pid = %s",
                (backend,),
            ).fetchone()[0],
            "the wait's slice to run out",
        )
        os.kill(waiter.pid, signal.SIGINT)
        os.kill(waiter.pid, signal.SIGCONT)
        out, _ = waiter.communicate(timeout=DEADLINE)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
        holder.release()
    assert waiter.returncode == 0
    assert json.loads(out) == {"closed": False, "held": 1}  # the other lock, still held


def _state(pid: int) -> str:
    """The state letter of process ``pid`` (T: stopped), from /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
