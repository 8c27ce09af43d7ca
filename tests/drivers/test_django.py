"""Django connections: every lock API takes ``django.db.connection`` and
``connections[alias]``, and the transaction is Django's.

Guards the reported bug (``with xact_lock(connection, ...)`` inside ``atomic()`` used to
commit the block's rows although the outer atomic rolled back), pgsolo's own transaction
outside atomic (committed with the block, rolled back when it raises, Django's books
clean either way, even when the connection died), and the end of a request releasing the
session locks a persistent connection still holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.core.signals import request_finished, request_started
from django.db import (
    DatabaseError,
    OperationalError,
    close_old_connections,
    connection,
    connections,
    transaction,
)

import pgsolo
from _drivers import django_settings
from _support import (
    WORK,
    Boom,
    Connect,
    eventually,
    new_job,
    terminate,
    wait_until_lost,
    work_rows,
)
from pgsolo import Key, session_lock, xact_lock
from pgsolo.drivers import TxStatus, adapt


@pytest.fixture(scope="module")
def dj(db: str) -> Iterator[Any]:
    """Django configured once per test process against the test database (see
    ``_drivers.django_settings`` for its aliases)."""
    django_settings(db)
    yield connections
    connections.close_all()


@pytest.fixture
def conn(dj: Any) -> Iterator[Any]:
    """``django.db.connection``, checked to be out of any atomic block afterwards."""
    yield connection
    assert not connection.in_atomic_block
    connection.close()


def insert(conn: Any, job: str, note: str) -> None:
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", [job, note])


def assert_django_clean(connection: Any) -> None:
    assert not connection.in_atomic_block
    assert connection.get_autocommit()
    assert adapt(connection).transaction_status() is TxStatus.IDLE


def test_adapts_the_proxy_and_the_wrapper_and_refuses_other_vendors(dj: Any, conn: Any) -> None:
    assert adapt(conn).connection is dj["default"]
    assert adapt(dj["default"]).connection is dj["default"]
    with pytest.raises(pgsolo.UnsupportedConnectionError, match="sqlite"):
        xact_lock(dj["lite"], "k")
    with pytest.raises(pgsolo.UnsupportedConnectionError):
        xact_lock(dj["default"].cursor(), "k")


def test_xact_lock_inside_atomic_joins_it_and_its_outer_rollback(
    conn: Any, observer: Any, key: Key
) -> None:
    """Regression: inside atomic() the lock joins Django's transaction; pgsolo commits
    nothing, the lock lasts until the outermost atomic ends, and an outer rollback (an
    exception, or set_rollback) undoes the block's rows."""
    job = new_job("django-join")

    def locked_writes_then_fail() -> None:
        with transaction.atomic():
            with xact_lock(conn, key, wait=5) as lock:
                assert lock.acquired
                insert(conn, job, "raised")
            with transaction.atomic():  # a savepoint of Django's; the lock is still held
                assert observer.holders(key) == {conn.connection.info.backend_pid}
            raise Boom

    with pytest.raises(Boom):
        locked_writes_then_fail()
    assert work_rows(observer, job) == []
    assert observer.holders(key) == set()
    with transaction.atomic():
        with xact_lock(conn, key) as lock:
            assert lock.acquired
            insert(conn, job, "set_rollback")
        transaction.set_rollback(True)
    with transaction.atomic(), xact_lock(conn, key) as lock:
        insert(conn, job, "committed by Django")
    assert work_rows(observer, job) == ["committed by Django"]
    assert observer.holders(key) == set()
    assert_django_clean(conn)


@pytest.mark.parametrize("writes", ["cursor", "nested-atomic"])
def test_own_transaction_outside_atomic_commits_or_rolls_back(
    conn: Any, observer: Any, key: Key, writes: str
) -> None:
    job = new_job("django-own")

    def write(note: str) -> None:
        if writes == "cursor":
            insert(conn, job, note)
        else:
            with transaction.atomic():
                insert(conn, job, note)

    with xact_lock(conn, key, wait=5) as lock:
        assert lock.acquired
        assert conn.in_atomic_block
        write("committed")
    assert_django_clean(conn)

    def fail() -> None:
        with xact_lock(conn, key):
            write("rolled back")
            raise Boom

    with pytest.raises(Boom):
        fail()
    assert_django_clean(conn)
    assert work_rows(observer, job) == ["committed"]
    assert observer.holders(key) == set()


@pytest.mark.parametrize("reached_the_server", [True, False], ids=["sent", "not-sent"])
def test_ctrl_c_in_the_commit_of_pgsolos_transaction_leaves_django_as_found(
    conn: Any, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch, reached_the_server: bool
) -> None:
    """Regression (the chaos campaign, 5 times in 200,000 attempts): a Ctrl-C in Django's
    COMMIT of pgsolo's atomic, after psycopg sent it and before it read the answer, left
    the connection ACTIVE; Django's atomic then failed to switch autocommit back on and
    raised its own ProgrammingError in the Ctrl-C's place, and the caller's next statement
    found the connection unusable. Now the Ctrl-C is what is raised, the COMMIT is read to
    its end and recorded as Django's (its on_commit callback runs), or, if it never reached
    the server, the transaction is rolled back (and the callback dropped); either way
    nothing is held and Django's books are as before the block."""
    job = new_job("django-ctrl-c")
    conn.ensure_connection()
    raw = conn.connection

    def interrupted_commit() -> None:
        if reached_the_server:
            raw.pgconn.send_query(b"COMMIT")  # what psycopg does, and then the Ctrl-C
        raise KeyboardInterrupt

    callbacks: list[str] = []
    with pytest.raises(KeyboardInterrupt), xact_lock(conn, key) as lock:  # noqa: PT012
        assert lock.acquired
        insert(conn, job, "the block's row")
        transaction.on_commit(lambda: callbacks.append("ran"))
        monkeypatch.setattr(raw, "commit", interrupted_commit)
    monkeypatch.undo()
    # As the next user finds it, before pgsolo's adapter (which settles it) is asked.
    assert raw.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert_django_clean(conn)
    assert observer.holders(key) == set()
    expected = ["the block's row"] if reached_the_server else []
    assert work_rows(observer, job) == expected
    assert callbacks == (["ran"] if reached_the_server else [])
    insert(conn, job, "after")  # the connection takes the caller's next statement
    assert sorted(work_rows(observer, job)) == sorted([*expected, "after"])


def test_ctrl_c_in_djangos_health_check_as_pgsolos_atomic_begins_leaves_django_as_found(
    conn: Any, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (the chaos campaign's Django finding, traced): Django's atomic checks a
    persistent connection's health (``SELECT 1``) on its way in; a Ctrl-C after psycopg
    sent it and before it read the answer left the connection ACTIVE, and pgsolo, whose
    atomic had not begun, handed it back so: the next request found it unusable. Now the
    statement is read to its end and the Ctrl-C goes on with Django's books as found."""
    conn.ensure_connection()
    raw = conn.connection

    def interrupted_health_check() -> None:
        raw.pgconn.send_query(b"SELECT 1")  # what psycopg does, and then the Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(conn, "close_if_health_check_failed", interrupted_health_check)
    with pytest.raises(KeyboardInterrupt), xact_lock(conn, key):
        pytest.fail("the block ran although its transaction never began")
    monkeypatch.undo()
    # As the next user finds it, before pgsolo's adapter (which settles it) is asked.
    assert raw.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert_django_clean(conn)
    assert observer.holders(key) == set()
    with conn.cursor() as cur:  # the next statement runs
        cur.execute("SELECT 1")
        assert cur.fetchone() == (1,)


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_ctrl_c_as_django_connects_for_pgsolo_leaves_no_half_made_connection(
    conn: Any, observer: Any, key: Key, monkeypatch: pytest.MonkeyPatch, lifetime: str
) -> None:
    """Regression (the chaos smoke, once in 450 attempts: the next request's connection had
    lost the time zone Django sets): Django's ``connect()`` keeps its new DBAPI connection
    before it configures the session (time zone, role, autocommit). A Ctrl-C between the
    two, in a connect that pgsolo's call caused, left a connection that Django takes for
    ready. Now pgsolo closes what it so opened: the caller handed a closed connection and
    gets one back, and Django connects afresh, configured, at its next statement."""
    conn.close()

    def interrupted_configuration() -> None:
        raise KeyboardInterrupt  # a Ctrl-C as the session is about to be configured

    monkeypatch.setattr(conn, "init_connection_state", interrupted_configuration)
    lock = xact_lock(conn, key) if lifetime == "xact" else session_lock(conn, key)
    with pytest.raises(KeyboardInterrupt), lock:
        pytest.fail("the block ran although the connection never opened")
    monkeypatch.undo()
    assert conn.connection is None  # nothing half made
    assert observer.holders(key) == set()
    with conn.cursor() as cur:  # Django connects afresh, with the session it configures
        cur.execute("SELECT current_setting('TimeZone')")
        assert cur.fetchone() == (conn.timezone_name,)
    assert_django_clean(conn)


def test_own_transaction_is_left_once_when_the_connection_dies(
    conn: Any, observer: Any, key: Key
) -> None:
    def die_inside() -> None:
        with xact_lock(conn, key):
            terminate(observer, conn.connection.info.backend_pid)
            insert(conn, "x", "never")

    with pytest.raises(DatabaseError):
        die_inside()
    assert not conn.in_atomic_block
    with xact_lock(conn, key) as lock:  # Django reconnects; its books are true
        assert lock.acquired
    assert_django_clean(conn)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_try_wait_busy_timeout_and_a_psycopg3_holder_both_ways(
    conn: Any, connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    factory = session_lock if lifetime == "session" else xact_lock
    for wait in (None, 5.0):
        with factory(conn, key, wait=wait) as lock:
            assert lock.acquired
            with factory(connect(), key) as other:
                assert not other.acquired
    holder = session_lock(connect(), key)
    assert holder.acquire()
    with factory(conn, key) as lock:
        assert not lock.acquired
    with pytest.raises(pgsolo.LockTimeoutError), factory(conn, key, wait=0.2):
        pass
    holder.release()
    assert observer.waiters(key) == set()
    assert_django_clean(conn)


def test_session_lock_inside_atomic_outlives_it(conn: Any, observer: Any, key: Key) -> None:
    lock = session_lock(conn, key, wait=5)
    with transaction.atomic():
        assert lock.acquire()
        transaction.set_rollback(True)
    assert observer.holders(key) == {conn.connection.info.backend_pid}
    lock.release()
    assert observer.holders(key) == set()


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_fencing_tokens_increase(conn: Any, key: Key, lifetime: str) -> None:
    factory = session_lock if lifetime == "session" else xact_lock
    tokens = []
    for _ in range(3):
        with factory(conn, key, wait=5, fencing=True) as lock:
            assert lock.token is not None
            tokens.append(lock.token)
    assert tokens == sorted(set(tokens))


def test_run_job_owns_its_transaction_outside_atomic_only(conn: Any, observer: Any) -> None:
    job = new_job("django-job")
    result = pgsolo.run_job(conn, job, lambda conn: insert(conn, job, "done"))
    assert result.outcome == "completed"

    def fail(conn: Any) -> None:
        insert(conn, job, "undone")
        raise Boom

    with pytest.raises(Boom):
        pgsolo.run_job(conn, job, fail)
    assert work_rows(observer, job) == ["done"]
    assert_django_clean(conn)
    with transaction.atomic(), pytest.raises(pgsolo.ConnectionStateError):
        pgsolo.run_job(conn, job, fail)


def test_request_end_releases_session_locks_of_a_persistent_connection(
    conn: Any, observer: Any, key: Key, caplog: pytest.LogCaptureFixture
) -> None:
    lock = session_lock(conn, key)
    assert lock.acquire()
    pid = conn.connection.info.backend_pid
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        request_finished.send(sender=None)
    assert conn.connection is not None  # persistent: still open
    assert observer.holders(key) == set()
    (warned,) = [r for r in caplog.records if "end of the request" in r.getMessage()]
    assert warned.pgsolo["event"] == "released-at-request-end"  # type: ignore[attr-defined]
    # The next request takes the key on the same session: the late release must not
    # unlock it (it did, and a third session took a key that request believed it held).
    request_started.send(sender=None)
    again = session_lock(conn, key)
    assert again.acquire()
    with pytest.raises(pgsolo.LockNotHeldError):
        lock.release()
    assert conn.connection.info.backend_pid == pid
    assert observer.holders(key) == {pid}
    again.release()


def test_request_end_of_a_closing_connection_reports_the_lock_lost(
    dj: Any, observer: Any, key: Key
) -> None:
    closing = dj["closing"]
    lock = session_lock(closing, key)
    assert lock.acquire()
    close_old_connections()  # what Django runs at a request's end: CONN_MAX_AGE=0 closes
    assert closing.connection is None
    eventually(lambda: observer.holders(key) == set(), "the closed session's lock is gone")
    with pytest.raises(pgsolo.LockLostError):
        lock.release()


def test_a_database_django_cannot_reach_is_database_unavailable_for_every_call(
    conn: Any, observer: Any, key: Key
) -> None:
    """Guards the words pgsolo fails in: Django connects at pgsolo's first statement, and
    its OperationalError came out of every call as it was (a singleton_command printed a
    traceback and exited 1, not 69)."""
    conn.close()
    port, password = conn.settings_dict["PORT"], conn.settings_dict["PASSWORD"]
    conn.settings_dict["PORT"] = "1"  # nothing listens there
    try:
        calls = (
            lambda: pgsolo.session_lock(conn, key).acquire(),
            lambda: pgsolo.xact_lock(conn, key).__enter__(),
            lambda: pgsolo.run_job(conn, key, lambda c: None),
        )
        for call in calls:
            with pytest.raises(
                pgsolo.DatabaseUnavailableError, match="could not connect"
            ) as raised:
                call()
            assert not password or password not in str(raised.value)
            assert conn.connection is None  # left closed, as it was handed
    finally:
        conn.settings_dict["PORT"] = port
    assert observer.holders(key) == set()


def test_keep_on_django_watches_the_lock(conn: Any, key: Key) -> None:
    with session_lock(conn, key, keep=pgsolo.Keep(interval=0.05)) as lock:
        lock.check()


# - a dead connection, in Django's words -


def request(work: Any) -> Any:
    """One request as Django's handler frames it: ``close_old_connections`` at its start
    and at its end (``request_started``/``request_finished``)."""
    from django.core.signals import request_started  # noqa: PLC0415

    request_started.send(sender=None)
    try:
        return work()
    finally:
        request_finished.send(sender=None)


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_a_dead_connection_is_one_django_recovers_from(
    conn: Any, observer: Any, key: Key, lifetime: str
) -> None:
    """Regression: after its backend died, pgsolo's statement raised the driver's raw
    ``AdminShutdown``, which Django never saw, so it never marked the persistent connection
    unusable and every later request's lock failed with ``ConnectionStateError("status
    unknown")``. Now the failure is pgsolo's ``DatabaseUnavailableError`` caused by Django's
    own ``OperationalError`` (raised through ``wrap_database_errors``, so Django's
    ``errors_occurred`` is set): the request's end closes the dead connection, and the next
    request's lock works on a new one."""
    factory = session_lock if lifetime == "session" else xact_lock

    def locked() -> bool:
        with factory(conn, key, wait=5) as lock:
            return bool(lock.acquired)

    assert request(locked)
    pid = conn.connection.info.backend_pid
    terminate(observer, pid)
    with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
        request(locked)
    assert isinstance(raised.value.__cause__, OperationalError)
    assert isinstance(raised.value.__cause__.__cause__, psycopg.OperationalError)
    # Closed by Django (at the request's end, or as pgsolo's own atomic block ended)
    assert conn.connection is None or conn.connection.info.backend_pid != pid
    assert request(locked)
    assert conn.connection.info.backend_pid != pid
    assert_django_clean(conn)
    assert observer.holders(key) == set()


def test_a_connection_the_keeper_found_dead_is_one_django_recovers_from(
    conn: Any, observer: Any, key: Key
) -> None:
    """Regression: a backend that died while a keeper watched its lock was found dead by
    pgsolo alone (no statement of Django's failed), so Django never marked the persistent
    connection unusable and the next request's lock was refused (``status unknown``). A
    connection pgsolo finds dead is on Django's books too (``errors_occurred``): the
    request's end closes it."""

    def watched() -> None:
        with session_lock(conn, key, keep=pgsolo.Keep(interval=0.05)) as lock:
            terminate(observer, conn.connection.info.backend_pid)
            wait_until_lost(lock)

    with pytest.raises(pgsolo.LockLostError):
        request(watched)
    assert conn.connection is None  # closed by Django at the request's end

    def locked() -> bool:
        with session_lock(conn, key) as lock:
            return bool(lock.acquired)

    assert request(locked)
    assert observer.holders(key) == set()
