"""The sync lock API against a real PostgreSQL: the article's checks and the failure paths.

Everything here runs on real sessions, threads and processes; what is asserted is what an
operator would see (``pg_locks`` through the ``observer`` session, ``SHOW``,
``pg_stat_activity``) or what the caller gets back (values, error types and messages).
The async twins live in ``test_locks_async.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

import pgsolo
from _support import eventually
from pgsolo import (
    ConnectionStateError,
    InvalidKeyError,
    Key,
    LockLostError,
    LockNotHeldError,
    LockTimeoutError,
    LockUnavailableError,
    TransactionFailedError,
    UsageError,
)
from pgsolo.drivers._psycopg import PsycopgDriver
from pgsolo.sql import lock_function

Connect = Callable[..., psycopg.Connection]
T = TypeVar("T")

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS
DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


# -- helpers ------------------------------------------------------------------------------


def pid_of(conn: psycopg.Connection) -> int:
    return conn.info.backend_pid


def show_lock_timeout(conn: psycopg.Connection) -> str:
    row = conn.execute("SHOW lock_timeout").fetchone()
    assert row is not None
    return str(row[0])


def backend_state(observer: Any, pid: int) -> tuple[str | None, str | None] | None:
    """(state, query) of a backend in pg_stat_activity, or None when it is gone."""
    row = observer.conn.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return (row[0], row[1]) if row else None


def backend_gone(observer: Any, pid: int) -> bool:
    return backend_state(observer, pid) is None


def run_threads(targets: list[Callable[[], None]], timeout: float = 30.0) -> list[BaseException]:
    """Run each target in its own thread; join with a bound; return what they raised."""
    errors: list[BaseException] = []
    guard = threading.Lock()

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                with guard:
                    errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, f"{len(stuck)} thread(s) still running after {timeout}s"
    return errors


class Child:
    """A child Python process whose stdout lines are read with a deadline."""

    def __init__(self, script: str, *args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def readline(self, timeout: float = 20.0) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"child printed nothing for {timeout}s; stderr: {''.join(self.stderr)}")
        if line is None:
            self.proc.wait(5)
            pytest.fail(
                f"child exited ({self.proc.returncode}) early; stderr: {''.join(self.stderr)}"
            )
        return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def children() -> Iterator[Callable[..., Child]]:
    started: list[Child] = []

    def start(script: str, *args: object) -> Child:
        child = Child(script, *args)
        started.append(child)
        return child

    yield start
    for child in started:
        child.kill()


@pytest.fixture
def table(observer: Any) -> Iterator[str]:
    """A real (not temporary) table, so the observer session can see what was committed."""
    name = f"pgsolo_work_{uuid.uuid4().hex[:12]}"
    observer.conn.execute(
        pgsql.SQL("CREATE TABLE {} (note text NOT NULL)").format(pgsql.Identifier(name))
    )
    yield name
    observer.conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(name)))


def insert_note(conn: psycopg.Connection, table: str, note: str) -> None:
    conn.execute(pgsql.SQL("INSERT INTO {} VALUES (%s)").format(pgsql.Identifier(table)), (note,))


def notes(observer: Any, table: str) -> list[str]:
    rows = observer.conn.execute(
        pgsql.SQL("SELECT note FROM {} ORDER BY note").format(pgsql.Identifier(table))
    ).fetchall()
    return [r[0] for r in rows]


def lock_factory(lifetime: str) -> Callable[..., pgsolo.Lock]:
    return pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock  # type: ignore[return-value]


# -- 1. the article's "Test concurrency intentionally", literally --------------------------

ARTICLE_KEY = (42, 1001)


def test_article_two_sessions_with_pgsolo(connect: Connect, observer: Any) -> None:
    a, b = connect(), connect()
    assert observer.holders(Key(ARTICLE_KEY)) == set()

    # Session A: BEGIN; try the xact lock -> true. Leave the transaction open.
    a.execute("BEGIN")
    assert pgsolo.xact_lock(a, ARTICLE_KEY).acquire() is True
    assert observer.holders(Key(ARTICLE_KEY)) == {pid_of(a)}

    # Session B: BEGIN; try -> false; ROLLBACK.
    b.execute("BEGIN")
    assert pgsolo.xact_lock(b, ARTICLE_KEY).acquire() is False
    b.execute("ROLLBACK")
    # The same through the context manager (BEGIN + try, then ROLLBACK at block end).
    with pgsolo.xact_lock(b, ARTICLE_KEY) as busy:
        assert busy.acquired is False
    assert b.info.transaction_status is psycopg.pq.TransactionStatus.IDLE

    # Finish session A: COMMIT releases the lock.
    a.execute("COMMIT")
    assert observer.holders(Key(ARTICLE_KEY)) == set()

    # Session B again: now true.
    b.execute("BEGIN")
    assert pgsolo.xact_lock(b, ARTICLE_KEY).acquire() is True
    assert observer.holders(Key(ARTICLE_KEY)) == {pid_of(b)}
    b.execute("COMMIT")
    assert observer.holders(Key(ARTICLE_KEY)) == set()


def test_article_raw_sql_and_pgsolo_interleaved(connect: Connect, observer: Any) -> None:
    raw, solo = connect(), connect()
    try_sql = "SELECT pg_try_advisory_xact_lock(42, 1001)"

    # A raw holder makes pgsolo report busy.
    raw.execute("BEGIN")
    assert raw.execute(try_sql).fetchone() == (True,)
    with pgsolo.xact_lock(solo, ARTICLE_KEY) as lock:
        assert lock.acquired is False
    assert pgsolo.session_lock(solo, ARTICLE_KEY).acquire() is False
    raw.execute("COMMIT")

    # Once the raw holder committed, pgsolo gets it; and a pgsolo holder makes raw SQL busy.
    with pgsolo.xact_lock(solo, ARTICLE_KEY) as lock:
        assert lock.acquired is True
        assert observer.holders(Key(ARTICLE_KEY)) == {pid_of(solo)}
        raw.execute("BEGIN")
        assert raw.execute(try_sql).fetchone() == (False,)
        raw.execute("ROLLBACK")
    assert observer.holders(Key(ARTICLE_KEY)) == set()

    # pgsolo committed at block end: raw SQL gets it again.
    raw.execute("BEGIN")
    assert raw.execute(try_sql).fetchone() == (True,)
    raw.execute("COMMIT")
    assert observer.holders(Key(ARTICLE_KEY)) == set()


# -- 2. rollback and job exceptions ---------------------------------------------------------


class JobFailedError(Exception):
    pass


def test_rollback_releases_xact_lock(connect: Connect, observer: Any, key: Key) -> None:
    conn, other = connect(autocommit=False), connect()
    assert pgsolo.xact_lock(conn, key).acquire() is True
    assert observer.holders(key) == {pid_of(conn)}
    conn.rollback()
    assert observer.holders(key) == set()
    with pgsolo.xact_lock(other, key) as lock:
        assert lock.acquired is True


def test_exception_in_xact_block_rolls_back_and_releases(
    connect: Connect, observer: Any, key: Key, table: str
) -> None:
    conn, other = connect(), connect()

    # The happy path commits, so the row check below can tell a rollback from a no-op.
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        insert_note(conn, table, "committed")
    assert notes(observer, table) == ["committed"]

    failure = JobFailedError("the job broke")

    def job() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            insert_note(conn, table, "rolled back")
            assert observer.holders(key) == {pid_of(conn)}
            raise failure

    with pytest.raises(JobFailedError) as raised:
        job()
    assert raised.value is failure
    assert notes(observer, table) == ["committed"]
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    with pgsolo.xact_lock(other, key) as lock:
        assert lock.acquired is True


def test_exception_in_session_block_releases_and_propagates_unchanged(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn, other = connect(), connect()
    failure = JobFailedError("upload failed")
    lock = pgsolo.session_lock(conn, key)

    def job() -> None:
        with lock:
            assert lock.acquired
            assert observer.holders(key) == {pid_of(conn)}
            raise failure

    with pytest.raises(JobFailedError) as raised:
        job()
    assert raised.value is failure
    assert type(raised.value) is JobFailedError
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    assert lock.acquired is False
    assert pgsolo.session_lock(other, key).acquire() is True


def test_caught_database_error_in_xact_block_commits_nothing(
    connect: Connect, observer: Any, key: Key, table: str
) -> None:
    conn = connect()

    def job() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
            insert_note(conn, table, "must not commit")
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT 1/0")  # caught here, and not re-raised

    with pytest.raises(TransactionFailedError):
        job()
    assert notes(observer, table) == []
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


# -- 3. abrupt disconnect ---------------------------------------------------------------------


def terminate(observer: Any, pid: int) -> None:
    row = observer.conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
    assert row == (True,)
    eventually(lambda: backend_gone(observer, pid), f"backend {pid} to exit")


def test_terminated_session_holder_loses_lock(connect: Connect, observer: Any, key: Key) -> None:
    holder, other = connect(), connect()
    lock = pgsolo.session_lock(holder, key)
    assert lock.acquire() is True
    pid = pid_of(holder)
    assert observer.holders(key) == {pid}
    assert pgsolo.session_lock(other, key).acquire() is False

    terminate(observer, pid)
    assert observer.holders(key) == set()
    theirs = pgsolo.session_lock(other, key)
    assert theirs.acquire() is True
    assert observer.holders(key) == {pid_of(other)}

    with pytest.raises(LockLostError) as raised:
        lock.release()
    assert raised.value.key == key
    assert pgsolo.held_session_locks(holder) == []
    # The holder's failed release did not disturb the new owner.
    assert observer.holders(key) == {pid_of(other)}
    theirs.release()


def test_terminated_holder_with_block_leaves_nothing_held(
    connect: Connect, observer: Any, key: Key
) -> None:
    holder, other = connect(), connect()

    def job() -> None:
        with pgsolo.session_lock(holder, key) as lock:
            assert lock.acquired
            terminate(observer, pid_of(holder))

    with pytest.raises(LockLostError):
        job()
    assert pgsolo.held_session_locks(holder) == []
    assert observer.holders(key) == set()
    assert pgsolo.session_lock(other, key).acquire() is True


def test_terminated_holder_with_failing_block_raises_the_block_error(
    connect: Connect, observer: Any, key: Key
) -> None:
    holder, other = connect(), connect()
    failure = JobFailedError("work failed while the connection died")

    def job() -> None:
        with pgsolo.session_lock(holder, key):
            terminate(observer, pid_of(holder))
            raise failure

    with pytest.raises(JobFailedError) as raised:
        job()
    assert raised.value is failure
    assert pgsolo.held_session_locks(holder) == []
    assert pgsolo.session_lock(other, key).acquire() is True


CHILD_HOLDS_LOCK = r"""
import sys, time
import psycopg
import pgsolo

dsn, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = psycopg.connect(dsn, autocommit=True)
lock = pgsolo.session_lock(conn, (a, b))
if not lock.acquire():
    print("busy", flush=True)
    sys.exit(3)
print("held", conn.info.backend_pid, flush=True)
time.sleep(120)
"""


def test_sigkilled_holder_process_releases(
    connect: Connect, observer: Any, key: Key, dsn: str, children: Callable[..., Child]
) -> None:
    assert isinstance(key.value, tuple)
    child = children(CHILD_HOLDS_LOCK, dsn, *key.value)
    word, child_pid = child.readline().split()
    assert word == "held"
    backend = int(child_pid)
    assert observer.holders(key) == {backend}
    other = connect()
    assert pgsolo.session_lock(other, key).acquire() is False

    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.wait(DEADLINE)
    assert child.proc.returncode == -signal.SIGKILL
    eventually(lambda: backend not in observer.holders(key), "the killed child's lock to go")
    assert pgsolo.session_lock(other, key).acquire() is True
    assert observer.holders(key) == {pid_of(other)}


# -- 4. pools ---------------------------------------------------------------------------------


def test_pool_reset_hook_releases_leaked_session_lock(
    dsn: str, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgsolo")
    with ConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        reset=pgsolo.pool_reset,
        kwargs={"autocommit": True},
        open=True,
    ) as pool:
        with pool.connection(timeout=DEADLINE) as conn:
            pid = pid_of(conn)
            assert pgsolo.session_lock(conn, key).acquire() is True  # never released
            assert observer.holders(key) == {pid}
            assert pgsolo.held_session_locks(conn) == [key]
        # The reset hook runs in a pool worker; the only connection comes back after it.
        with pool.connection(timeout=DEADLINE) as again:
            assert pid_of(again) == pid  # the same session: nothing was reconnected
            assert observer.holders(key) == set()
            assert pgsolo.held_session_locks(again) == []
            retaken = pgsolo.session_lock(again, key)
            assert retaken.acquire() is True
            retaken.release()
    warnings = [r for r in caplog.records if r.name == "pgsolo" and key.text in r.getMessage()]
    assert warnings, "the reset hook should warn about the leaked lock"


def test_pool_without_reset_hook_leaks_session_lock(dsn: str, observer: Any, key: Key) -> None:
    with ConnectionPool(
        dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=True
    ) as pool:
        with pool.connection(timeout=DEADLINE) as conn:
            pid = pid_of(conn)
            assert pgsolo.session_lock(conn, key).acquire() is True
        with pool.connection(timeout=DEADLINE) as again:
            assert pid_of(again) == pid
            # Leaked: the observer still sees the returned connection holding it.
            assert observer.holders(key) == {pid}
            assert pgsolo.held_session_locks(again) == [key]
            again.execute("SELECT pg_advisory_unlock_all()")
    assert observer.holders(key) == set()


def test_pool_exhaustion_times_out_instead_of_hanging(dsn: str, observer: Any, key: Key) -> None:
    with ConnectionPool(
        dsn,
        min_size=1,
        max_size=1,
        reset=pgsolo.pool_reset,
        kwargs={"autocommit": True},
        open=True,
    ) as pool:
        with pool.connection(timeout=DEADLINE) as conn, pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            started = time.monotonic()
            with pytest.raises(PoolTimeout):
                pool.connection(timeout=0.5).__enter__()
            assert time.monotonic() - started < DEADLINE
            assert observer.holders(key) == {pid_of(conn)}
        assert observer.holders(key) == set()


# -- 5. many threads racing for one key -----------------------------------------------------


class Critical:
    """Counts who is inside; every entry checks it is alone."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.inside = 0
        self.max_inside = 0
        self.entries = 0

    def enter(self) -> None:
        with self.guard:
            self.inside += 1
            self.entries += 1
            self.max_inside = max(self.max_inside, self.inside)
            alone = self.inside == 1
        try:
            assert alone, "two holders inside the critical section at once"
            time.sleep(0.002)
        finally:
            with self.guard:
                self.inside -= 1


@pytest.mark.parametrize(
    ("lifetime", "wait"),
    [("xact", None), ("session", None), ("xact", 20.0), ("session", 20.0)],
    ids=["xact-try", "session-try", "xact-wait", "session-wait"],
)
def test_threads_race_for_one_key(
    connect: Connect, key: Key, lifetime: str, wait: float | None
) -> None:
    n_threads = 16
    rounds = 15 if wait is None else 4
    conns = [connect() for _ in range(n_threads)]
    start = threading.Barrier(n_threads)
    critical = Critical()
    entered = [0] * n_threads
    make = lock_factory(lifetime)

    def worker(i: int) -> Callable[[], None]:
        def run() -> None:
            start.wait(DEADLINE)
            for _ in range(rounds):
                with make(conns[i], key, wait=wait) as lock:
                    if lock.acquired:
                        critical.enter()
                        entered[i] += 1

        return run

    errors = run_threads([worker(i) for i in range(n_threads)], timeout=40)
    assert errors == []
    assert critical.max_inside == 1
    assert critical.entries >= 1
    if wait is not None:
        assert entered == [rounds] * n_threads  # everybody got in, one at a time


def test_shared_holders_coexist_and_exclusive_excludes(
    connect: Connect, observer: Any, key: Key
) -> None:
    n_shared = 6
    conns = [connect() for _ in range(n_shared)]
    all_in = threading.Barrier(n_shared + 1)
    done = threading.Barrier(n_shared + 1)

    def shared_holder(conn: psycopg.Connection) -> Callable[[], None]:
        def run() -> None:
            with pgsolo.session_lock(conn, key, shared=True, wait=DEADLINE) as lock:
                assert lock.acquired
                all_in.wait(DEADLINE)  # every shared holder holds at the same time
                done.wait(DEADLINE)

        return run

    excl = connect()
    outcome: dict[str, object] = {}

    def main_side() -> None:
        all_in.wait(DEADLINE)
        try:
            outcome["holders"] = observer.holders(key)
            outcome["exclusive_try"] = pgsolo.session_lock(excl, key).acquire()
            with pgsolo.xact_lock(excl, key) as lock:
                outcome["exclusive_xact_try"] = lock.acquired
        finally:
            done.wait(DEADLINE)

    errors = run_threads([shared_holder(c) for c in conns] + [main_side], timeout=30)
    assert errors == []
    assert outcome["holders"] == {pid_of(c) for c in conns}
    assert outcome["exclusive_try"] is False
    assert outcome["exclusive_xact_try"] is False
    assert observer.holders(key) == set()

    # A mixed race: shared holders never meet an exclusive one, exclusive ones are alone.
    guard = threading.Lock()
    state = {"shared": 0, "exclusive": 0, "max_exclusive": 0, "excl_entries": 0}
    start = threading.Barrier(n_shared + 2)
    excl_conns = [excl, connect()]

    def shared_racer(conn: psycopg.Connection) -> Callable[[], None]:
        def run() -> None:
            start.wait(DEADLINE)
            for _ in range(10):
                with pgsolo.session_lock(conn, key, shared=True) as lock:
                    if lock.acquired:
                        with guard:
                            state["shared"] += 1
                            assert state["exclusive"] == 0
                        time.sleep(0.001)
                        with guard:
                            state["shared"] -= 1

        return run

    def exclusive_racer(conn: psycopg.Connection) -> Callable[[], None]:
        def run() -> None:
            start.wait(DEADLINE)
            for _ in range(10):
                with pgsolo.xact_lock(conn, key, wait=DEADLINE) as lock:
                    assert lock.acquired
                    with guard:
                        state["exclusive"] += 1
                        state["excl_entries"] += 1
                        state["max_exclusive"] = max(state["max_exclusive"], state["exclusive"])
                        assert state["shared"] == 0
                    time.sleep(0.001)
                    with guard:
                        state["exclusive"] -= 1

        return run

    errors = run_threads(
        [shared_racer(c) for c in conns] + [exclusive_racer(c) for c in excl_conns], timeout=30
    )
    assert errors == []
    assert state["max_exclusive"] == 1
    assert state["excl_entries"] == 20
    assert observer.holders(key) == set()


# -- 6. two threads sharing one connection --------------------------------------------------


def test_second_thread_on_same_connection_is_refused(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    held = threading.Event()
    finish = threading.Event()
    first: dict[str, object] = {}

    def first_thread() -> None:
        lock = pgsolo.session_lock(conn, key)
        first["acquired"] = lock.acquire()
        held.set()
        assert finish.wait(DEADLINE)
        lock.release()

    thread = threading.Thread(target=first_thread, daemon=True)
    thread.start()
    try:
        assert held.wait(DEADLINE)
        assert first["acquired"] is True
        assert observer.holders(key) == {pid_of(conn)}

        # PostgreSQL itself would grant the key again to this session...
        k1, k2 = key.value  # type: ignore[misc]
        assert conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (k1, k2)).fetchone() == (True,)
        assert conn.execute("SELECT pg_advisory_unlock(%s, %s)", (k1, k2)).fetchone() == (True,)
        # ...but pgsolo refuses a second holder on the same connection.
        second = pgsolo.session_lock(conn, key)
        assert second.acquire() is False
        assert second.acquired is False
        with pytest.raises(LockUnavailableError) as raised:
            pgsolo.session_lock(conn, key, wait=5).acquire()
        assert not isinstance(raised.value, LockTimeoutError)
        assert raised.value.key == key
        assert "already held on this connection" in str(raised.value)
        with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired is False
        # The first thread's hold is untouched.
        assert observer.holders(key) == {pid_of(conn)}
        assert pgsolo.held_session_locks(conn) == [key]
    finally:
        finish.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_busy_answer_while_the_holder_runs_statements_on_the_shared_connection(
    connect: Connect, observer: Any, key: Key
) -> None:
    """The holder's work keeps the connection busy; a second thread still gets "busy"."""
    conn = connect()
    pid = pid_of(conn)
    held = threading.Event()

    def holder() -> None:
        with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            held.set()
            with contextlib.suppress(psycopg.errors.QueryCanceled):
                conn.execute("SELECT pg_sleep(60)")  # the protected work, until cancelled

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert held.wait(DEADLINE)
        eventually(
            lambda: (backend_state(observer, pid) or ("", ""))[0] == "active",
            "the holder's statement to run",
        )
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.ACTIVE
        assert pgsolo.session_lock(conn, key).acquire() is False
        with pytest.raises(LockUnavailableError) as raised:
            pgsolo.session_lock(conn, key, wait=5).acquire()
        assert not isinstance(raised.value, LockTimeoutError)
        assert observer.holders(key) == {pid}
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.ACTIVE
    finally:
        observer.conn.execute("SELECT pg_cancel_backend(%s)", (pid,))
        thread.join(DEADLINE)
    assert not thread.is_alive()
    assert observer.holders(key) == set()


def test_threads_sharing_one_connection_never_hold_together(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    n_threads = 4
    start = threading.Barrier(n_threads)
    critical = Critical()
    in_flight: list[ConnectionStateError] = []

    def worker() -> None:
        start.wait(DEADLINE)
        for _ in range(15):
            try:
                with pgsolo.session_lock(conn, key) as lock:
                    if lock.acquired:
                        critical.enter()
            except ConnectionStateError as exc:
                # A new attempt that meets another thread's unlock on the wire is refused
                # rather than guessed at; it holds nothing.
                in_flight.append(exc)

    assert run_threads([worker] * n_threads) == []
    assert critical.max_inside == 1
    assert critical.entries >= 1
    assert all("running another statement" in str(e) for e in in_flight)
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_reentrant_holds_are_counted(connect: Connect, observer: Any, key: Key) -> None:
    conn = connect()
    outer = pgsolo.session_lock(conn, key, reentrant=True)
    inner = pgsolo.session_lock(conn, key, reentrant=True)
    assert outer.acquire() is True
    assert inner.acquire() is True
    assert observer.holders(key) == {pid_of(conn)}
    inner.release()
    assert observer.holders(key) == {pid_of(conn)}  # the outer hold remains
    assert pgsolo.held_session_locks(conn) == [key]
    outer.release()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    # Only one unlock reached the server: a further raw unlock finds nothing held.
    k1, k2 = key.value  # type: ignore[misc]
    assert conn.execute("SELECT pg_advisory_unlock(%s, %s)", (k1, k2)).fetchone() == (False,)


# -- 7. bounded waits ---------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_wait_times_out_with_key_and_timeout_and_keeps_lock_timeout(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    holder, waiter = connect(), connect()
    assert pgsolo.session_lock(holder, key).acquire() is True
    waiter.execute("SET lock_timeout = '7s'")

    def attempt() -> None:
        if lifetime == "session":
            pgsolo.session_lock(waiter, key, wait=0.3).acquire()
        else:
            with pgsolo.xact_lock(waiter, key, wait=0.3):
                pytest.fail("the block must not run without the lock")

    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as raised:
        attempt()
    assert time.monotonic() - started < DEADLINE
    error = raised.value
    assert error.timeout == 0.3
    assert error.key == key
    assert key.text in str(error)
    assert "0.3s" in str(error)
    assert isinstance(error, TimeoutError)
    assert show_lock_timeout(waiter) == "7s"
    assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert observer.advisory(pid=pid_of(waiter)) == set()
    assert observer.waiters(key) == set()
    assert pgsolo.held_session_locks(waiter) == []


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_wait_timeout_inside_callers_transaction_leaves_it_usable(
    connect: Connect, observer: Any, key: Key, table: str, lifetime: str
) -> None:
    holder, waiter = connect(), connect()
    assert pgsolo.session_lock(holder, key).acquire() is True
    waiter.execute("SET lock_timeout = '7s'")
    with waiter.transaction():
        insert_note(waiter, table, "before the wait")
        lock = lock_factory(lifetime)(waiter, key, wait=0.3)
        with pytest.raises(LockTimeoutError):
            lock.acquire()
        assert waiter.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
        assert waiter.execute("SELECT 41 + 1").fetchone() == (42,)
        assert show_lock_timeout(waiter) == "7s"
        insert_note(waiter, table, "after the wait")
    assert notes(observer, table) == ["after the wait", "before the wait"]
    assert show_lock_timeout(waiter) == "7s"
    assert observer.advisory(pid=pid_of(waiter)) == set()


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_wait_succeeds_when_holder_releases_midway(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    holder, waiter = connect(), connect()
    holding = pgsolo.session_lock(holder, key)
    assert holding.acquire() is True
    waiter.execute("SET lock_timeout = '7s'")
    waiter_pid = pid_of(waiter)
    saw_waiting = threading.Event()

    def release_once_waiting() -> None:
        eventually(lambda: waiter_pid in observer.waiters(key), "the waiter to wait")
        saw_waiting.set()
        holding.release()

    releaser = threading.Thread(target=release_once_waiting, daemon=True)
    releaser.start()
    try:
        if lifetime == "session":
            lock = pgsolo.session_lock(waiter, key, wait=10)
            assert lock.acquire() is True
            releaser.join(DEADLINE)
            assert observer.holders(key) == {waiter_pid}
            lock.release()
        else:
            with pgsolo.xact_lock(waiter, key, wait=10) as lock:
                assert lock.acquired is True
                releaser.join(DEADLINE)
                assert observer.holders(key) == {waiter_pid}
    finally:
        releaser.join(DEADLINE)
    assert saw_waiting.is_set()
    assert observer.holders(key) == set()
    assert show_lock_timeout(waiter) == "7s"


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_successful_wait_inside_callers_transaction_keeps_its_lock_timeout(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    """The caller's later statements must not run under pgsolo's wait as lock_timeout."""
    conn = connect()
    before = show_lock_timeout(conn)
    assert before != "7s"
    with conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '7s'")
        lock = lock_factory(lifetime)(conn, key, wait=0.5)
        assert lock.acquire() is True
        assert show_lock_timeout(conn) == "7s"
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(key) == {pid_of(conn)}
        # A pgsolo context joining the caller's transaction behaves the same.
        other_key = Key((key.value[0], key.value[1] + 500_000))  # type: ignore[index]
        with lock_factory(lifetime)(conn, other_key, wait=0.5) as inner:
            assert inner.acquired
            assert show_lock_timeout(conn) == "7s"
        assert show_lock_timeout(conn) == "7s"
    assert show_lock_timeout(conn) == before  # the SET LOCAL ended with the transaction
    if lifetime == "session":
        assert observer.holders(key) == {pid_of(conn)}  # a session lock outlives it
        lock.release()
    assert observer.holders(key) == set()
    assert observer.holders(other_key) == set()


@pytest.mark.parametrize("autocommit", [True, False])
def test_protected_block_runs_with_the_connections_own_lock_timeout(
    connect: Connect, observer: Any, key: Key, autocommit: bool
) -> None:
    """The wait's bound applies to the wait, not to the statements protected by it."""
    conn = connect(autocommit=autocommit)
    conn.execute("SET lock_timeout = '7s'")
    if not autocommit:
        conn.commit()
    with pgsolo.xact_lock(conn, key, wait=0.5) as lock:
        assert lock.acquired
        assert observer.holders(key) == {pid_of(conn)}
        assert show_lock_timeout(conn) == "7s"
    assert show_lock_timeout(conn) == "7s"
    assert observer.holders(key) == set()


# -- 8. refusals before any SQL -----------------------------------------------------------------


def test_xact_acquire_on_autocommit_idle_connection_is_refused(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    marker = f"SELECT 'pgsolo-marker-{uuid.uuid4().hex}'"
    conn.execute(marker)
    with pytest.raises(ConnectionStateError, match="autocommit"):
        pgsolo.xact_lock(conn, key).acquire()
    with pytest.raises(ConnectionStateError, match="autocommit"):
        pgsolo.xact_lock(conn, key, wait=5).acquire()
    assert backend_state(observer, pid_of(conn)) == ("idle", marker)
    assert observer.holders(key) == set()


BAD_KEYS = [True, 1.5, 2**63, "", "a\0b"]


@pytest.mark.parametrize("bad", BAD_KEYS, ids=repr)
@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_bad_key_refused_before_any_sql(connect: Connect, bad: object, lifetime: str) -> None:
    conn = connect()
    conn.close()  # a closed connection: anything that touched it would fail differently
    with pytest.raises(InvalidKeyError):
        lock_factory(lifetime)(conn, bad)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), True], ids=repr)
@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_bad_wait_refused_before_any_sql(
    connect: Connect, key: Key, bad: object, lifetime: str
) -> None:
    conn = connect()
    conn.close()
    with pytest.raises(UsageError):
        lock_factory(lifetime)(conn, key, wait=bad)


def test_bad_options_leave_open_connection_untouched(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    marker = f"SELECT 'pgsolo-marker-{uuid.uuid4().hex}'"
    conn.execute(marker)
    for bad in BAD_KEYS:
        with pytest.raises(InvalidKeyError):
            pgsolo.session_lock(conn, bad).acquire()  # type: ignore[arg-type]
    for wait in (0, -1, math.nan, True):
        with pytest.raises(UsageError):
            pgsolo.xact_lock(conn, key, wait=wait)
    assert backend_state(observer, pid_of(conn)) == ("idle", marker)


def test_xact_lock_has_no_release(connect: Connect, key: Key) -> None:
    conn = connect()
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        with pytest.raises(UsageError, match="COMMIT or ROLLBACK"):
            lock.release()


def test_release_of_never_acquired_session_lock(connect: Connect, key: Key) -> None:
    conn = connect()
    with pytest.raises(LockNotHeldError) as raised:
        pgsolo.session_lock(conn, key).release()
    assert raised.value.key == key


def test_unlock_all_behind_pgsolos_back_is_reported_on_release(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire() is True
    conn.execute("SELECT pg_advisory_unlock_all()")
    assert observer.holders(key) == set()
    assert lock.is_held() is False
    with pytest.raises(LockNotHeldError) as raised:
        lock.release()
    assert raised.value.key == key
    assert pgsolo.held_session_locks(conn) == []


# -- 9. autocommit=False connections -------------------------------------------------------------


def test_xact_context_on_non_autocommit_connection(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect(autocommit=False)
    assert conn.info.transaction_status is IDLE
    with pgsolo.xact_lock(conn, key) as lock:
        assert lock.acquired
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(key) == {pid_of(conn)}
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == set()
    assert backend_state(observer, pid_of(conn))[0] == "idle"  # type: ignore[index]
    # A busy try on the same kind of connection ends idle too.
    other = connect()
    with pgsolo.session_lock(other, key):
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired is False
        assert conn.info.transaction_status is IDLE


def test_xact_plain_acquire_on_non_autocommit_connection(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect(autocommit=False)
    lock = pgsolo.xact_lock(conn, key)
    assert lock.acquire() is True
    assert conn.info.transaction_status is INTRANS
    assert observer.holders(key) == {pid_of(conn)}
    conn.commit()
    assert observer.holders(key) == set()
    assert conn.info.transaction_status is IDLE


@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
def test_session_lock_on_non_autocommit_connection_stays_idle(
    connect: Connect, observer: Any, key: Key, wait: float | None
) -> None:
    conn = connect(autocommit=False)
    pid = pid_of(conn)
    lock = pgsolo.session_lock(conn, key, wait=wait)
    assert lock.acquire() is True
    assert conn.info.transaction_status is IDLE
    assert backend_state(observer, pid)[0] == "idle"  # type: ignore[index]
    assert observer.holders(key) == {pid}
    assert lock.is_held() is True
    assert conn.info.transaction_status is IDLE
    lock.release()
    assert conn.info.transaction_status is IDLE
    assert backend_state(observer, pid)[0] == "idle"  # type: ignore[index]
    assert observer.holders(key) == set()
    # A busy try leaves it idle as well.
    other = connect()
    with pgsolo.session_lock(other, key):
        assert pgsolo.session_lock(conn, key).acquire() is False
        assert conn.info.transaction_status is IDLE


# -- 10. an interrupted wait leaves no lock -------------------------------------------------------


CHILD_INTERRUPTED_WAIT = r"""
import json, signal, sys, time
import psycopg
import pgsolo

# Python's own default; a child started from a non-interactive shell may inherit SIG_IGN.
signal.signal(signal.SIGINT, signal.default_int_handler)
dsn, a, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
conn = psycopg.connect(dsn, autocommit=True)
print("pid", conn.info.backend_pid, flush=True)
try:
    pgsolo.session_lock(conn, (a, b), wait=30).acquire()
    print(json.dumps({"outcome": "acquired"}), flush=True)
except KeyboardInterrupt:
    rows = conn.execute(
        "SELECT classid::bigint, objid::bigint, objsubid, mode FROM pg_locks"
        " WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    ).fetchall()
    print(json.dumps({
        "outcome": "interrupted",
        "pid": conn.info.backend_pid,
        "locks": rows,
        "status": conn.info.transaction_status.name,
        "tracked": [k.text for k in pgsolo.held_session_locks(conn)],
    }), flush=True)
time.sleep(120)
"""


def test_interrupted_wait_leaves_no_lock(
    connect: Connect, observer: Any, key: Key, dsn: str, children: Callable[..., Child]
) -> None:
    holder = connect()
    holding = pgsolo.session_lock(holder, key)
    assert holding.acquire() is True
    assert isinstance(key.value, tuple)
    child = children(CHILD_INTERRUPTED_WAIT, dsn, *key.value)
    word, child_backend = child.readline().split()
    assert word == "pid"
    backend = int(child_backend)
    eventually(lambda: backend in observer.waiters(key), "the child to wait for the lock")

    child.proc.send_signal(signal.SIGINT)
    report = json.loads(child.readline())
    assert report["outcome"] == "interrupted"
    assert report["pid"] == backend
    assert report["locks"] == []
    assert report["status"] == "IDLE"
    assert report["tracked"] == []
    assert observer.waiters(key) == set()

    holding.release()
    assert backend_state(observer, backend) is not None  # still connected...
    assert observer.advisory(pid=backend) == set()  # ...and holding nothing
    assert observer.advisory(pid=backend, granted=False) == set()
    assert observer.holders(key) == set()


# -- 11. logging -------------------------------------------------------------------------------


def pgsolo_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pgsolo"]


def test_acquisition_is_logged_with_context(
    connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgsolo")
    conn, other = connect(), connect()
    name = f"nightly-report-{uuid.uuid4().hex[:8]}"
    with pgsolo.session_lock(conn, name) as lock:
        assert lock.acquired
        assert pgsolo.session_lock(other, name).acquire() is False
    records = pgsolo_records(caplog)
    by_event = {r.pgsolo["event"]: r for r in records}  # type: ignore[attr-defined]
    acquired = by_event["acquired"]
    fields = acquired.pgsolo  # type: ignore[attr-defined]
    assert fields["key"] == lock.key.text
    assert fields["name"] == name
    assert fields["database"] == conn.info.dbname
    assert str(conn.info.port) in fields["server"]
    assert fields["backend_pid"] == pid_of(conn)
    assert fields["lifetime"] == "session"
    assert isinstance(fields["duration_ms"], float)
    assert fields["duration_ms"] >= 0
    message = acquired.getMessage()
    assert message.startswith("advisory lock acquired:")
    for text in (
        f"key={lock.key.text}",
        f"name={name}",
        f"database={conn.info.dbname}",
        f"backend_pid={pid_of(conn)}",
        "duration_ms=",
        "server=",
    ):
        assert text in message
    assert acquired.levelno == logging.INFO
    busy = by_event["busy"]
    assert busy.pgsolo["backend_pid"] == pid_of(other)  # type: ignore[attr-defined]
    assert busy.pgsolo["name"] == name  # type: ignore[attr-defined]


def test_password_never_logged_or_in_errors(
    connect: Connect, observer: Any, key: Key, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgsolo")
    password = "sekret-pw-123"  # noqa: S105 - a throwaway role's password, on purpose
    role = f"pgsolo_pw_{uuid.uuid4().hex[:10]}"
    observer.conn.execute(
        pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    secret_dsn = make_conninfo(dsn, user=role, password=password)
    assert password in secret_dsn
    conn: psycopg.Connection | None = None
    messages: list[str] = []
    try:
        conn = psycopg.connect(secret_dsn, autocommit=True)
        assert conn.info.user == role
        assert conn.info.password == password
        holder = connect()

        with pgsolo.session_lock(conn, key) as lock:  # acquired, released
            assert lock.acquired
            messages.append(repr(lock))
        with pgsolo.xact_lock(conn, key) as lock:
            assert lock.acquired
        assert pgsolo.session_lock(holder, key).acquire() is True
        assert pgsolo.session_lock(conn, key).acquire() is False  # busy
        with pytest.raises(LockTimeoutError) as timeout:
            pgsolo.session_lock(conn, key, wait=0.2).acquire()
        xact_wait = pgsolo.xact_lock(conn, key, wait=0.2)
        with pytest.raises(LockTimeoutError) as xact_timeout:
            xact_wait.__enter__()
        with pytest.raises(LockNotHeldError) as not_held:
            pgsolo.session_lock(conn, "never-taken").release()
        messages += [str(timeout.value), str(xact_timeout.value), str(not_held.value)]
        messages += [repr(timeout.value), repr(xact_timeout.value)]
    finally:
        if conn is not None:
            conn.close()
        observer.conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))

    records = pgsolo_records(caplog)
    events = {r.pgsolo.get("event") for r in records if hasattr(r, "pgsolo")}
    assert {"acquired", "busy", "timeout", "release-not-held"} <= events
    # The log does name the server and user-facing context, so the check below is not vacuous.
    assert any(role not in r.getMessage() and "database=" in r.getMessage() for r in records)
    for record in records:
        messages += [record.getMessage(), repr(record.__dict__)]
    for text in messages:
        assert password not in text
    assert "database" in str(timeout.value)


# -- 12. shared vs exclusive ---------------------------------------------------------------------


def test_shared_and_exclusive_session_locks(connect: Connect, observer: Any, key: Key) -> None:
    s1, s2, x = connect(), connect(), connect()
    first = pgsolo.session_lock(s1, key, shared=True)
    second = pgsolo.session_lock(s2, key, shared=True)
    assert first.acquire() is True
    assert second.acquire() is True
    assert observer.holders(key) == {pid_of(s1), pid_of(s2)}
    assert pgsolo.session_lock(x, key).acquire() is False
    with pgsolo.xact_lock(x, key) as lock:
        assert lock.acquired is False
    first.release()
    assert pgsolo.session_lock(x, key).acquire() is False  # one shared holder is enough
    second.release()

    exclusive = pgsolo.session_lock(x, key)
    assert exclusive.acquire() is True
    assert pgsolo.session_lock(s1, key, shared=True).acquire() is False
    with pgsolo.xact_lock(s2, key, shared=True) as lock:
        assert lock.acquired is False
    assert observer.holders(key) == {pid_of(x)}
    exclusive.release()
    assert observer.holders(key) == set()


def test_shared_and_exclusive_xact_locks(connect: Connect, observer: Any, key: Key) -> None:
    s1, s2, x = connect(), connect(), connect()
    with pgsolo.xact_lock(s1, key, shared=True) as a, pgsolo.xact_lock(s2, key, shared=True) as b:
        assert a.acquired
        assert b.acquired
        assert observer.holders(key) == {pid_of(s1), pid_of(s2)}
        with pgsolo.xact_lock(x, key) as lock:
            assert lock.acquired is False
    with pgsolo.xact_lock(x, key) as lock:
        assert lock.acquired
        with pgsolo.xact_lock(s1, key, shared=True) as shared:
            assert shared.acquired is False
    assert observer.holders(key) == set()


def test_threads_sharing_one_connection_cannot_both_enter_an_xact_block(
    connect: Connect, observer: Any, key: Key
) -> None:
    """A transaction pgsolo opened is tracked like a session lock: a second thread on the
    same connection would otherwise join it and PostgreSQL would grant the key again."""
    conn = connect()
    with pgsolo.xact_lock(conn, key) as first:
        assert first.acquired
        outcome: list[object] = []

        def second() -> None:
            try:
                outcome.append(pgsolo.xact_lock(conn, key).acquire())
            except pgsolo.PgsoloError as exc:
                outcome.append(exc)
            try:
                with pgsolo.xact_lock(conn, key, wait=5):
                    outcome.append("entered")
            except pgsolo.LockUnavailableError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=second)
        worker.start()
        worker.join(30)
        assert not worker.is_alive()
    assert outcome[0] is False
    assert isinstance(outcome[1], pgsolo.LockUnavailableError)
    assert "already held on this connection" in str(outcome[1])
    assert observer.holders(key) == set()
    # Once the block is over the key is free for the connection again.
    with pgsolo.xact_lock(conn, key) as again:
        assert again.acquired


# -- 12. regressions: interruptions at precise points, claims that must not be shared ----------
#
# KeyboardInterrupt can land at any bytecode, e.g. right after the server answered and
# before pgsolo looked at the answer. A real SIGINT cannot be aimed that precisely, so
# these tests wrap the driver's ``fetch_value`` to raise KeyboardInterrupt exactly there.
# That injects an *interruption*, not a fake database: every statement still runs on the
# real server (or, for "instead", is not sent at all, as when Ctrl-C comes first), and
# what is asserted is what pg_locks says. Each rule fires once, only for statements that
# contain the given text, and only after the rules before it have fired.


class Interrupter:
    """Raise KeyboardInterrupt around chosen round trips of pgsolo's psycopg driver."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pending: list[tuple[str, str]] = []  # (text in a statement, "instead"/"after")
        self.fired: list[str] = []
        original = PsycopgDriver.fetch_value

        def fetch_value(driver: PsycopgDriver, statements: Any, wait: float = 0.0) -> object:
            when = self._take(statements)
            if when == "instead":
                raise KeyboardInterrupt
            value = original(driver, statements, wait)
            if when == "after":
                raise KeyboardInterrupt
            return value

        monkeypatch.setattr(PsycopgDriver, "fetch_value", fetch_value)

    def _take(self, statements: Any) -> str | None:
        if not self.pending:
            return None
        needle, when = self.pending[0]
        if not any(needle in statement for statement in statements):
            return None
        self.pending.pop(0)
        self.fired.append(needle)
        return when

    def once(self, needle: str, when: str) -> Interrupter:
        assert when in ("instead", "after")
        self.pending.append((needle, when))
        return self

    def assert_all_fired(self) -> None:
        assert self.pending == [], f"these interruptions never happened: {self.pending}"


def lock_call(key: Key, *, wait: bool, unlock: bool = False) -> str:
    """pgsolo's lock (or unlock) call for ``key``, e.g. ``pg_try_advisory_lock(1, 2)``."""
    if unlock:
        return f"pg_advisory_unlock({key.sql_args})"
    return f"{lock_function('session', wait=wait, shared=False)}({key.sql_args})"


def second_key(key: Key) -> Key:
    assert isinstance(key.value, tuple)
    return Key((key.value[0], key.value[1] + 500_000))


HELD_CHECK = "FROM pg_locks"  # pgsolo's "does this backend hold the key?" question


def test_reentrant_session_lock_does_not_ride_on_an_xact_claim(
    connect: Connect, observer: Any, key: Key
) -> None:
    """A key taken by xact_lock is not a session hold: "re-entering" it as a session lock
    would send no SQL and leave a session lock that vanishes at COMMIT."""
    conn = connect()
    pid = pid_of(conn)
    with pgsolo.xact_lock(conn, key) as xact:
        assert xact.acquired
        session = pgsolo.session_lock(conn, key, reentrant=True)
        assert session.acquire() is False  # busy: held by this connection, not re-entered
        assert session.acquired is False
        with pytest.raises(LockUnavailableError) as raised:
            pgsolo.session_lock(conn, key, reentrant=True, wait=5).acquire()
        assert "already held on this connection" in str(raised.value)
        assert pgsolo.held_session_locks(conn) == []
        assert observer.holders(key) == {pid}
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []
    with pytest.raises(LockNotHeldError):
        session.release()
    # The key is free again, for this connection as a session lock too.
    again = pgsolo.session_lock(conn, key, reentrant=True)
    assert again.acquire() is True
    assert observer.holders(key) == {pid}
    again.release()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
def test_session_acquire_interrupted_after_the_grant_inside_callers_transaction(
    connect: Connect,
    observer: Any,
    key: Key,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
    wait: float | None,
) -> None:
    """Ctrl-C right after the server granted the lock, inside the caller's transaction:
    the caller's transaction stays usable (its work is kept) and no lock is left behind."""
    conn = connect()
    pid = pid_of(conn)
    interrupter = Interrupter(monkeypatch).once(lock_call(key, wait=wait is not None), "after")
    with conn.transaction():
        insert_note(conn, table, "before")
        with pytest.raises(KeyboardInterrupt):
            pgsolo.session_lock(conn, key, wait=wait).acquire()
        interrupter.assert_all_fired()
        assert conn.info.transaction_status is INTRANS
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert observer.holders(key) == set()
        assert pgsolo.held_session_locks(conn) == []
        insert_note(conn, table, "after")
    assert conn.info.transaction_status is IDLE
    assert sorted(notes(observer, table)) == ["after", "before"]  # the caller's work kept
    assert observer.holders(key) == set()
    assert observer.advisory(pid=pid) == set()
    # Nothing is tracked either: the key can be taken again on this connection.
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire() is True
    lock.release()
    assert observer.holders(key) == set()


RELEASE_SETUPS = ["autocommit", "callers-transaction", "non-autocommit"]


def _release_setup(connect: Connect, setup: str) -> psycopg.Connection:
    conn = connect(autocommit=setup != "non-autocommit")
    if setup == "callers-transaction":
        conn.execute("BEGIN")
        conn.execute("SELECT 1")
    return conn


def _expected_status(setup: str) -> psycopg.pq.TransactionStatus:
    return INTRANS if setup == "callers-transaction" else IDLE


@pytest.mark.parametrize("setup", RELEASE_SETUPS)
def test_release_interrupted_before_the_unlock_was_sent(
    connect: Connect, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    """Ctrl-C before the unlock went out: either pgsolo finished the release, or the lock
    is still held, tracked and ``acquired`` so that release() can be called again."""
    conn = _release_setup(connect, setup)
    pid = pid_of(conn)
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire() is True
    assert observer.holders(key) == {pid}
    interrupter = Interrupter(monkeypatch).once(lock_call(key, wait=False, unlock=True), "instead")
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    interrupter.assert_all_fired()
    if lock.acquired:
        # Kept on the books: consistent with the server, and releasable.
        assert observer.holders(key) == {pid}
        assert pgsolo.held_session_locks(conn) == [key]
        lock.release()  # must not raise LockNotHeldError
    else:
        assert observer.holders(key) == set()
        assert pgsolo.held_session_locks(conn) == []
    assert lock.acquired is False
    assert observer.holders(key) == set()
    assert observer.advisory(pid=pid) == set()
    assert pgsolo.held_session_locks(conn) == []
    assert conn.info.transaction_status is _expected_status(setup)
    assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("setup", RELEASE_SETUPS)
def test_release_interrupted_after_the_unlock_ran(
    connect: Connect, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch, setup: str
) -> None:
    conn = _release_setup(connect, setup)
    pid = pid_of(conn)
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire() is True
    interrupter = Interrupter(monkeypatch).once(lock_call(key, wait=False, unlock=True), "after")
    with pytest.raises(KeyboardInterrupt):
        lock.release()
    interrupter.assert_all_fired()
    assert lock.acquired is False
    assert observer.holders(key) == set()
    assert observer.advisory(pid=pid) == set()
    assert pgsolo.held_session_locks(conn) == []
    with pytest.raises(LockNotHeldError):
        lock.release()
    assert conn.info.transaction_status is _expected_status(setup)
    assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "callers-transaction"])
@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
def test_second_interruption_during_acquire_cleanup_leaves_no_stale_claim(
    connect: Connect,
    observer: Any,
    key: Key,
    monkeypatch: pytest.MonkeyPatch,
    wait: float | None,
    in_transaction: bool,
) -> None:
    """Ctrl-C instead of the lock call, then again during the pg_locks check of the
    clean-up: the key must not stay claimed on the connection (it would be "busy" forever)."""
    conn = connect()
    pid = pid_of(conn)
    if in_transaction:
        conn.execute("BEGIN")
    interrupter = (
        Interrupter(monkeypatch)
        .once(lock_call(key, wait=wait is not None), "instead")
        .once(HELD_CHECK, "instead")
    )
    with pytest.raises(KeyboardInterrupt):
        pgsolo.session_lock(conn, key, wait=wait).acquire()
    interrupter.assert_all_fired()
    monkeypatch.undo()
    assert pgsolo.held_session_locks(conn) == []
    assert observer.holders(key) == set()  # the lock call never reached the server
    if in_transaction:
        assert conn.info.transaction_status is INTRANS
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.execute("COMMIT")
    assert conn.info.transaction_status is IDLE
    lock = pgsolo.session_lock(conn, key)
    assert lock.acquire() is True  # not "busy, held by this connection"
    assert observer.holders(key) == {pid}
    assert pgsolo.held_session_locks(conn) == [key]
    lock.release()
    assert observer.holders(key) == set()
    assert pgsolo.held_session_locks(conn) == []


def test_nested_xact_blocks_in_one_thread(connect: Connect, observer: Any, key: Key) -> None:
    conn = connect()
    pid = pid_of(conn)
    inner_key = second_key(key)
    with pgsolo.xact_lock(conn, key) as outer:
        assert outer.acquired
        with pgsolo.xact_lock(conn, inner_key) as inner:
            assert inner.acquired
            assert observer.holders(key) == {pid}
            assert observer.holders(inner_key) == {pid}
        # The inner block joined the outer transaction: its lock lasts until that ends.
        assert conn.info.transaction_status is INTRANS
        assert observer.holders(inner_key) == {pid}
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == set()
    assert observer.holders(inner_key) == set()


def test_second_thread_cannot_join_an_xact_block_for_another_key(
    connect: Connect, observer: Any, key: Key
) -> None:
    """Thread A is inside ``with xact_lock(conn, k1)`` (pgsolo opened the transaction);
    thread B's ``with xact_lock(conn, k2)`` would join A's transaction and be committed
    by A: refused. A's block then ends normally."""
    conn = connect()
    pid = pid_of(conn)
    key2 = second_key(key)
    inside = threading.Event()
    finish = threading.Event()
    seen: dict[str, object] = {}

    def thread_a() -> None:
        with pgsolo.xact_lock(conn, key) as lock:
            seen["a_acquired"] = lock.acquired
            inside.set()
            assert finish.wait(DEADLINE)
            seen["a_select"] = conn.execute("SELECT 1").fetchone()
        seen["a_status"] = conn.info.transaction_status

    def thread_b() -> None:
        assert inside.wait(DEADLINE)
        try:
            try:
                with pgsolo.xact_lock(conn, key2) as lock:
                    seen["b_entered"] = lock.acquired
            except ConnectionStateError as exc:
                seen["b_context"] = exc
            seen["b_holders"] = observer.holders(key2)
            try:
                seen["b_plain"] = pgsolo.xact_lock(conn, key2).acquire()
            except ConnectionStateError as exc:
                seen["b_plain"] = exc
        finally:
            finish.set()

    assert run_threads([thread_a, thread_b]) == []
    assert seen["a_acquired"] is True
    assert "b_entered" not in seen
    assert isinstance(seen["b_context"], ConnectionStateError)
    assert "another thread or task" in str(seen["b_context"])
    assert isinstance(seen["b_plain"], ConnectionStateError)
    assert seen["b_holders"] == set()
    assert seen["a_select"] == (1,)
    assert seen["a_status"] is IDLE
    assert observer.holders(key) == set()
    assert observer.holders(key2) == set()
    assert observer.advisory(pid=pid) == set()
    # Once A's block is over, the connection is free for any thread.
    with pgsolo.xact_lock(conn, key2) as lock:
        assert lock.acquired


def test_plain_xact_wait_timeout_on_non_autocommit_idle_connection_keeps_it_usable(
    connect: Connect, observer: Any, key: Key
) -> None:
    """psycopg begins the transaction implicitly: it is the caller's, and a timeout must
    not leave it aborted."""
    holder = connect()
    assert pgsolo.session_lock(holder, key).acquire() is True
    conn = connect(autocommit=False, options="-c lock_timeout=7s")
    assert conn.info.transaction_status is IDLE
    started = time.monotonic()
    with pytest.raises(LockTimeoutError) as raised:
        pgsolo.xact_lock(conn, key, wait=0.3).acquire()
    assert time.monotonic() - started < DEADLINE
    assert raised.value.key == key
    assert raised.value.timeout == pytest.approx(0.3)
    assert conn.info.transaction_status is INTRANS  # not INERROR
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert show_lock_timeout(conn) == "7s"
    assert observer.advisory(pid=pid_of(conn)) == set()
    conn.rollback()
    assert conn.info.transaction_status is IDLE
    assert observer.holders(key) == {pid_of(holder)}
