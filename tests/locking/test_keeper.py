"""The keeper on sync connections: ``session_lock(conn, key, keep=...)``.

Every test runs against a real PostgreSQL. Losses are real: the holder's backend is
terminated (``pg_terminate_backend``), its lock is released behind pgsolo's back on the
same session, or a TCP relay in front of the server stops passing the server's answers on.
What the keeper does is checked the way an operator would see it: ``pg_locks`` and
``pg_stat_activity`` from another session (the ``observer`` fixture), never only what
pgsolo says about itself.

The async keeper is in ``test_keeper_async.py``. The last section holds cases found in
review: descriptors above 1023, a beat that timed out, pipelines, re-entrant holds.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

import _support
import pgsolo
from _relay import FreezingProxy
from _support import DEADLINE, eventually, terminate
from pgsolo import Keep, Key, LockLostError, UsageError, sql

Connect = Callable[..., psycopg.Connection]

INTERVAL = 0.05  # beats are cheap on a local server; several fit in any test's window


# -- helpers -----------------------------------------------------------------------------


class OnLost:
    """An ``on_lost`` callback that records what it got, and in which thread."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.errors: list[LockLostError] = []
        self.threads: list[str] = []
        self._fail = fail
        self._guard = threading.Lock()

    def __call__(self, error: LockLostError) -> None:
        with self._guard:
            self.errors.append(error)
            self.threads.append(threading.current_thread().name)
        if self._fail is not None:
            raise self._fail


def keeper_threads(key: Key | None = None) -> list[threading.Thread]:
    prefix = "pgsolo-keeper" if key is None else f"pgsolo-keeper {key}"
    return [t for t in threading.enumerate() if t.name == prefix or t.name.startswith(prefix)]


def activity(observer: Any, pid: int) -> tuple[str | None, str | None]:
    """(state, last query) of backend ``pid`` as pg_stat_activity shows it."""
    row = observer.conn.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return (None, None) if row is None else (row[0], row[1])


def wait_for_beat(observer: Any, pid: int, key: Key, *, shared: bool = False) -> None:
    """Until the keeper's statement is the last one backend ``pid`` ran (run something
    else first to wait for a *new* beat)."""
    beat = sql.keeper_beat(key, shared=shared)
    eventually(lambda: activity(observer, pid)[1] == beat, f"a keeper beat on backend {pid}")


def wait_until_lost(lock: pgsolo.Lock, what: str = "the keeper to report the loss") -> None:
    eventually(lambda: lock.lost, what)


def assert_still_usable(conn: psycopg.Connection) -> None:
    assert conn.execute("SELECT 41 + 1").fetchone() == (42,)
    if not conn.autocommit:
        conn.commit()
    assert conn.info.transaction_status is pq.TransactionStatus.IDLE


# -- loss: the backend is terminated -----------------------------------------------------


def test_terminated_backend_is_lost_in_a_with_block(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.1, on_lost=on_lost))

    def block() -> None:
        with lock:
            pid = lock.backend_pid
            assert pid is not None
            assert observer.holders(key) == {pid}
            assert not lock.lost
            lock.check()  # nothing found yet: no error
            terminate(observer, pid)
            wait_until_lost(lock)
            with pytest.raises(LockLostError) as checked:
                lock.check()
            assert checked.value is lock.loss

    with pytest.raises(LockLostError) as at_exit:
        block()
    loss = lock.loss
    assert loss is not None
    assert at_exit.value is loss  # the block ran to its end, but not all of it locked
    assert loss.reason == "connection-lost"
    assert loss.key == key
    assert str(key) in str(loss)
    assert "lost" in repr(lock)
    eventually(lambda: not keeper_threads(key), "the keeper thread to end")
    assert on_lost.errors == [loss]
    assert all(name.startswith("pgsolo-keeper") for name in on_lost.threads)
    assert observer.holders(key) == set()
    other = connect()
    assert pgsolo.session_lock(other, key).acquire() is True
    assert observer.holders(key) == {other.info.backend_pid}


def test_terminated_backend_is_lost_and_release_raises_it(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.1, on_lost=on_lost))
    assert lock.acquire() is True
    pid = lock.backend_pid
    assert pid is not None
    terminate(observer, pid)
    wait_until_lost(lock)
    loss = lock.loss
    assert loss is not None
    assert loss.reason == "connection-lost"
    with pytest.raises(LockLostError) as released:
        lock.release()
    assert released.value is loss
    assert on_lost.errors == [loss]
    assert pgsolo.held_session_locks(conn) == []
    other = connect()
    with pgsolo.session_lock(other, key) as taken:
        assert taken.acquired
        assert observer.holders(key) == {other.info.backend_pid}


def test_body_error_wins_over_the_loss_at_exit(connect: Connect, observer: Any, key: Key) -> None:
    conn = connect()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL))

    def block() -> None:
        with lock:
            assert lock.backend_pid is not None
            terminate(observer, lock.backend_pid)
            wait_until_lost(lock)
            raise KeyError("the body's own")

    with pytest.raises(KeyError, match="the body's own"):
        block()
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"


# -- loss: released behind pgsolo's back on the same session ------------------------------


@pytest.mark.parametrize(
    "statement",
    ["SELECT pg_advisory_unlock_all()", "SELECT pg_advisory_unlock({args})"],
    ids=["unlock-all", "unlock-key"],
)
def test_released_behind_pgsolos_back_is_lock_released(
    connect: Connect, observer: Any, key: Key, statement: str
) -> None:
    conn = connect()
    pid = conn.info.backend_pid
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))

    def block() -> None:
        with lock:
            assert observer.holders(key) == {pid}
            conn.execute(statement.format(args=key.sql_args))
            assert observer.holders(key) == set()
            wait_until_lost(lock)

    with pytest.raises(LockLostError) as at_exit:
        block()
    loss = lock.loss
    assert loss is not None
    assert at_exit.value is loss
    assert loss.reason == "lock-released"
    assert on_lost.errors == [loss]
    # The session itself is fine: only the lock went.
    assert conn.info.backend_pid == pid
    assert_still_usable(conn)
    assert pgsolo.held_session_locks(conn) == []
    with pgsolo.session_lock(conn, key) as again:
        assert again.acquired


def test_released_behind_pgsolos_back_then_release_raises_the_loss(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL))
    assert lock.acquire()
    conn.execute("SELECT pg_advisory_unlock_all()")
    wait_until_lost(lock)
    with pytest.raises(LockLostError) as released:
        lock.release()
    assert released.value is lock.loss
    assert lock.loss is not None
    assert lock.loss.reason == "lock-released"
    assert observer.holders(key) == set()
    assert_still_usable(conn)


# -- no false alarms, no disturbance ---------------------------------------------------


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-xact"])
def test_no_false_alarm_while_the_user_works_on_the_connection(
    connect: Connect, observer: Any, key: Key, autocommit: bool
) -> None:
    """The holder's own thread and another thread run statements and transactions on the
    lock's connection for many beats: no loss, every answer right, and the keeper never
    leaves a transaction open (psycopg's implicit BEGIN included)."""
    conn = connect(autocommit=autocommit)
    on_lost = OnLost()
    errors: list[BaseException] = []
    stop = threading.Event()

    def other_thread() -> None:
        i = 0
        try:
            while not stop.is_set():
                i += 1
                # (with autocommit off it joins whatever transaction is open: the
                # holder's thread commits)
                assert conn.execute("SELECT %s::int * 2", (i,)).fetchone() == (2 * i,)
        except BaseException as exc:  # reported by the test's thread
            errors.append(exc)

    with pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost)) as lock:
        pid = conn.info.backend_pid
        worker = threading.Thread(target=other_thread)
        worker.start()
        deadline = time.monotonic() + 1.0  # about twenty beats
        i = 0
        while time.monotonic() < deadline:
            i += 1
            rows = conn.execute("SELECT g FROM generate_series(1, %s) AS g", (i,)).fetchall()
            assert rows == [(g,) for g in range(1, i + 1)]
            with conn.transaction():
                conn.execute("SET LOCAL application_name = 'pgsolo-keeper-test'")
                time.sleep(INTERVAL)  # a beat is due meanwhile: it must wait
                assert conn.execute("SHOW application_name").fetchone() == ("pgsolo-keeper-test",)
            if not autocommit:
                conn.commit()
        stop.set()
        worker.join(DEADLINE)
        assert not worker.is_alive()
        assert errors == []
        if not autocommit:
            conn.commit()
        assert conn.info.transaction_status is pq.TransactionStatus.IDLE
        # Now only the keeper uses the connection: it beats, and never in a transaction.
        conn.execute("SELECT 'before the keeper alone'")
        if not autocommit:
            conn.commit()
        wait_for_beat(observer, pid, key)
        states, statuses = set(), set()
        for _ in range(25):
            states.add(activity(observer, pid)[0])
            statuses.add(conn.info.transaction_status)  # ACTIVE while a beat is out
            time.sleep(INTERVAL / 2)
        assert statuses <= {pq.TransactionStatus.IDLE, pq.TransactionStatus.ACTIVE}
        assert "idle in transaction" not in states
        assert states <= {"idle", "active"}
        assert not lock.lost
        assert observer.holders(key) == {pid}
    assert on_lost.errors == []
    assert lock.loss is None
    assert observer.holders(key) == set()
    assert activity(observer, pid)[0] == "idle"
    assert_still_usable(conn)


def test_shared_locks_are_kept_and_lost_one_by_one(
    connect: Connect, observer: Any, key: Key
) -> None:
    first, second = connect(), connect()
    keep = Keep(interval=INTERVAL)
    a = pgsolo.session_lock(first, key, shared=True, keep=keep)
    assert a.acquire()
    with pgsolo.session_lock(second, key, shared=True, keep=keep) as b:
        assert observer.holders(key) == {first.info.backend_pid, second.info.backend_pid}
        wait_for_beat(observer, first.info.backend_pid, key, shared=True)
        wait_for_beat(observer, second.info.backend_pid, key, shared=True)
        assert not a.lost
        assert not b.lost
        terminate(observer, first.info.backend_pid)
        wait_until_lost(a)
        second.execute("SELECT 'after the first one went'")
        wait_for_beat(observer, second.info.backend_pid, key, shared=True)
        assert not b.lost  # its own lock is still there
        assert a.loss is not None
        assert a.loss.reason == "connection-lost"
        with pytest.raises(LockLostError):
            a.release()
        assert observer.holders(key) == {second.info.backend_pid}
    assert not b.lost
    assert observer.holders(key) == set()


def test_reentrant_inner_release_does_not_make_the_outer_lose(
    connect: Connect, observer: Any, key: Key
) -> None:
    conn = connect()
    keep = Keep(interval=INTERVAL)
    with pgsolo.session_lock(conn, key, reentrant=True, keep=keep) as outer:
        with pgsolo.session_lock(conn, key, reentrant=True, keep=keep) as inner:
            assert inner.acquired
        conn.execute("SELECT 'inner released'")
        wait_for_beat(observer, conn.info.backend_pid, key)
        assert not outer.lost
        assert not inner.lost
        assert observer.holders(key) == {conn.info.backend_pid}
    assert observer.holders(key) == set()


# -- the keeper's lifetime -------------------------------------------------------------


def test_keep_true_watches_with_the_defaults_and_keep_false_does_not(
    connect: Connect, key: Key
) -> None:
    conn = connect()
    with pgsolo.session_lock(conn, key, keep=True) as lock:
        threads = keeper_threads(key)
        assert len(threads) == 1
        assert threads[0].daemon  # never keeps the process alive
        assert lock.loss is None
        lock.check()
    assert keeper_threads(key) == []
    with pgsolo.session_lock(conn, key, keep=False) as unwatched:
        assert unwatched.acquired
        assert keeper_threads(key) == []
    with pgsolo.session_lock(conn, key) as plain:
        assert plain.acquired
        assert keeper_threads(key) == []


def test_no_keeper_when_the_lock_was_not_acquired(
    connect: Connect, observer: Any, key: Key
) -> None:
    holder, conn = connect(), connect()
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    keep = Keep(interval=INTERVAL)
    with pgsolo.session_lock(conn, key, keep=keep) as lock:
        assert not lock.acquired
        assert keeper_threads(key) == []
    with pytest.raises(pgsolo.LockTimeoutError):
        pgsolo.session_lock(conn, key, wait=0.2, keep=keep).acquire()
    assert keeper_threads(key) == []
    assert observer.holders(key) == {holder.info.backend_pid}


@pytest.mark.parametrize("how", ["with", "release"])
def test_keeper_stops_on_release_and_reports_nothing_later(
    connect: Connect, observer: Any, key: Key, how: str
) -> None:
    conn = connect()
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))
    pid = conn.info.backend_pid
    if how == "with":
        with lock:
            assert len(keeper_threads(key)) == 1
            wait_for_beat(observer, pid, key)
    else:
        assert lock.acquire()
        assert len(keeper_threads(key)) == 1
        wait_for_beat(observer, pid, key)
        lock.release()
    assert keeper_threads(key) == []  # stopped, not merely told to stop
    conn.execute("SELECT 'released'")
    terminate(observer, pid)
    time.sleep(10 * INTERVAL)  # ten beats would have been due: none may run
    assert not lock.lost
    assert lock.loss is None
    assert on_lost.errors == []
    lock.check()


# -- the user's transaction: skipped, then resumed ------------------------------------------


@pytest.mark.parametrize("explicit", [True, False], ids=["transaction", "implicit-begin"])
def test_keeper_skips_during_a_user_transaction_and_resumes_after(
    connect: Connect, observer: Any, key: Key, explicit: bool
) -> None:
    conn = connect(autocommit=explicit)
    pid = conn.info.backend_pid
    on_lost = OnLost()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))
    marker = "SELECT 'the user is in a transaction'"

    def work_in_a_transaction() -> None:
        conn.execute("SET LOCAL application_name = 'pgsolo-in-xact'")
        conn.execute(marker)
        # Many beats are due while the transaction is open: none runs inside it.
        for _ in range(20):
            assert activity(observer, pid) == ("idle in transaction", marker)
            time.sleep(INTERVAL)
        assert conn.execute("SHOW application_name").fetchone() == ("pgsolo-in-xact",)
        conn.execute("CREATE TEMP TABLE pgsolo_keeper_skip (n int)")
        conn.execute("INSERT INTO pgsolo_keeper_skip VALUES (1)")

    def block() -> None:
        with lock:
            wait_for_beat(observer, pid, key)
            if explicit:
                with conn.transaction():
                    work_in_a_transaction()
            else:
                work_in_a_transaction()  # in psycopg's implicit transaction
                conn.commit()
            assert conn.execute("SELECT count(*) FROM pgsolo_keeper_skip").fetchone() == (1,)
            if not explicit:
                conn.commit()
            assert not lock.lost
            assert conn.info.transaction_status is pq.TransactionStatus.IDLE
            # Resumed: it beats again, and so it sees the next loss.
            wait_for_beat(observer, pid, key)
            terminate(observer, pid)
            wait_until_lost(lock)

    with pytest.raises(LockLostError):
        block()
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"
    assert on_lost.errors == [lock.loss]


# -- on_lost that raises ---------------------------------------------------------------------


def test_on_lost_that_raises_is_logged_and_stays_in_the_keeper(
    connect: Connect,
    observer: Any,
    key: Key,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    escaped: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    caplog.set_level(logging.INFO, logger="pgsolo")
    conn = connect()
    on_lost = OnLost(fail=RuntimeError("the callback broke"))
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL, on_lost=on_lost))

    def block() -> None:
        with lock:
            assert lock.backend_pid is not None
            terminate(observer, lock.backend_pid)
            wait_until_lost(lock)
            eventually(lambda: not keeper_threads(key), "the keeper thread to end")

    with pytest.raises(LockLostError) as at_exit:
        block()
    assert at_exit.value is lock.loss
    assert on_lost.errors == [lock.loss]
    assert escaped == []
    failures = [r for r in caplog.records if "on_lost" in r.getMessage()]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)
    lost_events = [
        r
        for r in caplog.records
        if r.getMessage().startswith("advisory lock lost") and r.levelno == logging.ERROR
    ]
    assert len(lost_events) == 1
    assert lost_events[0].pgsolo["reason"] == "connection-lost"  # type: ignore[attr-defined]


# -- an unresponsive server (half-open connection) --------------------------------------------


def test_unresponsive_server_is_lost_and_the_connection_shut_down(
    dsn: str, observer: Any, key: Key
) -> None:
    on_lost = OnLost()
    with FreezingProxy(dsn) as proxy, psycopg.connect(proxy.dsn, autocommit=True) as conn:
        lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.2, timeout=1.0, on_lost=on_lost))
        assert lock.acquire()
        server_pid = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert server_pid is not None
        assert observer.holders(key) == {server_pid[0]}
        proxy.freeze()  # from now on the server's answers never arrive
        wait_until_lost(lock)
        loss = lock.loss
        assert loss is not None
        assert loss.reason == "connection-unresponsive"
        assert on_lost.errors == [loss]
        # The connection is dead for every later use, at once, instead of hanging.
        outcome: list[BaseException | None] = []

        def use() -> None:
            try:
                conn.execute("SELECT 1")
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        user = threading.Thread(target=use, daemon=True)
        user.start()
        user.join(DEADLINE)
        assert not user.is_alive(), "a statement on the shut-down connection hung"
        assert conn.closed or isinstance(outcome[0], psycopg.OperationalError)
        with pytest.raises(LockLostError) as released:
            lock.release()
        assert released.value is loss
        # The server notices the client went away and the lock with it.
        eventually(lambda: observer.holders(key) == set(), "the server to drop the lock")


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"interval": 0},
        {"interval": -1},
        {"interval": math.nan},
        {"interval": math.inf},
        {"interval": True},
        {"interval": "1"},
        {"timeout": 0},
        {"timeout": "x"},
        {"timeout": math.nan},
        {"on_lost": 3},
        {"on_lost": "print"},
        {"cancel": "yes"},
    ],
    ids=repr,
)
def test_bad_keep_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as refused:
        Keep(**options)
    (name,) = options
    assert name.removeprefix("on_") in str(refused.value)


@pytest.mark.parametrize(
    "keep",
    ["yes", 1, 0.5, Keep, {"interval": 1.0}, Keep(cancel=True)],
    ids=["str", "int", "float", "class", "dict", "cancel-on-sync"],
)
def test_bad_keep_is_refused_before_any_sql(
    connect: Connect, observer: Any, key: Key, keep: Any
) -> None:
    conn = connect()
    pid = conn.info.backend_pid
    with pytest.raises(UsageError):
        pgsolo.session_lock(conn, key, keep=keep)
    assert activity(observer, pid) == ("idle", "")  # nothing was ever sent
    assert observer.holders(key) == set()
    assert keeper_threads(key) == []


def test_xact_lock_has_no_keeper(connect: Connect, observer: Any, key: Key) -> None:
    conn = connect()
    with pytest.raises(TypeError, match="keep"):
        pgsolo.xact_lock(conn, key, keep=True)  # type: ignore[call-arg]
    assert activity(observer, conn.info.backend_pid) == ("idle", "")


# -- sharing the connection: regressions -------------------------------------------------


def beats_after_now(observer: Any, pid: int, count: int) -> None:
    """Until backend ``pid`` has started ``count`` more statements (beats, when nobody
    else uses its connection)."""
    query = "SELECT query_start FROM pg_stat_activity WHERE pid = %s"
    for _ in range(count):
        before = observer.conn.execute(query, (pid,)).fetchone()
        eventually(
            lambda before=before: observer.conn.execute(query, (pid,)).fetchone() != before,
            f"another statement on backend {pid}",
        )


def test_notifications_are_not_swallowed_by_beats(
    connect: Connect, observer: Any, key: Key
) -> None:
    """A notification that arrives between the user's ``notifies()`` calls must reach the
    next call (it does without a keeper: see the first half)."""
    conn, sender = connect(), connect()
    conn.execute("LISTEN pgsolo_keeper_test")
    pid = conn.info.backend_pid
    with pgsolo.session_lock(conn, key):  # no keeper: the notification is there at once
        sender.execute("NOTIFY pgsolo_keeper_test, 'unwatched'")
        time.sleep(0.3)
        unwatched = [n.payload for n in conn.notifies(timeout=2.0, stop_after=1)]
    assert unwatched == ["unwatched"]
    with pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL)):
        wait_for_beat(observer, pid, key)
        sender.execute("NOTIFY pgsolo_keeper_test, 'watched'")
        beats_after_now(observer, pid, 2)  # the notification reached the socket by then
        watched = [n.payload for n in conn.notifies(timeout=2.0, stop_after=1)]
    assert watched == ["watched"]


def test_other_locks_on_the_connection_are_not_refused_during_a_beat(
    connect: Connect, observer: Any, key: Key
) -> None:
    """The user takes other locks on the kept lock's connection just while a beat is out
    (found by watching the connection's status turn ACTIVE with nothing else running):
    pgsolo must wait for the beat as psycopg does, not refuse."""
    conn = connect()
    other = pgsolo.as_key(f"pgsolo-keeper-test-{uuid.uuid4().hex}")
    refused: list[str] = []
    attempts = 0
    with pgsolo.session_lock(conn, key, keep=Keep(interval=INTERVAL)) as kept:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and attempts < 10:
            if conn.info.transaction_status is not pq.TransactionStatus.ACTIVE:
                continue  # spin: a beat is out only for a moment
            attempts += 1
            try:
                with pgsolo.xact_lock(conn, other) as xact:
                    assert xact.acquired
            except pgsolo.ConnectionStateError as exc:
                refused.append(str(exc))
        assert not kept.lost
    assert attempts > 0
    assert refused == []
    assert observer.holders(other) == set()


# -- found in review -----------------------------------------------------------------------


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


def test_beats_during_a_users_pipeline_neither_fail_nor_disturb_it(
    connect: Connect, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    """The user runs a psycopg pipeline on the kept lock's connection (synced: idle, but still
    in pipeline mode) while beats are due every 10 ms: the beats must neither fail nor report
    a loss or log a warning, and every pipeline result stays right."""
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
