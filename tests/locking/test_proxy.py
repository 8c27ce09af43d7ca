"""Session locks and what sits between the client and the server.

Through a real PgBouncer in ``pool_mode=transaction`` a session lock is refused with an
error that names the cause and the fix, whether the bouncer is idle (every statement of a
lone client lands on the same backend, so a naive "who answers" check passes) or busy
(other clients' transactions move this one around), and nothing is left held on any
server connection. Through PgBouncer in ``pool_mode=session`` and through a plain TCP
relay (what a NAT or a TCP load balancer looks like to the server) session locks work.
What is asserted is what the server shows (``pg_locks`` through the direct ``observer``).

A session stamp wiped by RESET ALL behind a relay never strands a lock, and a second
connection that cannot be opened for the check fails as pgsolo (last sections).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import eventually, json_document, server_pid
from pgsolo import Key, UnsafeConnectionError
from pgsolo.cli.exit_codes import EXIT_UNSAFE
from pgsolo.testing import Bouncer, Relay, bouncer_client

BUSY_CLIENTS = 8  # more than the bouncer's pool: every server connection is in demand


def assert_refusal_explains_itself(error: BaseException) -> None:
    text = str(error)
    assert "transaction-pooling proxy" in text
    assert "pool_mode=transaction" in text
    assert "xact_lock()" in text  # the fix: transaction-level locks...
    assert "pool_mode=session" in text  # ...or a session-pinned connection


@pytest.fixture
def busy(bouncer: Bouncer) -> Iterator[None]:
    """Other clients running short transactions through the bouncer without pause."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        try:
            with bouncer_client(bouncer) as conn:
                while not stop.is_set():
                    with conn.transaction():
                        conn.execute("SELECT pg_sleep(0.002)")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, daemon=True) for _ in range(BUSY_CLIENTS)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # let them fill the pool
    yield
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors


# -- transaction pooling: refused, nothing left behind --------------------------------------


@pytest.mark.parametrize("wait", [None, 5.0], ids=["try", "wait"])
def test_session_lock_through_an_idle_transaction_pooler_is_refused(
    via_bouncer: Callable[..., psycopg.Connection[Any]],
    observer: Any,
    key: Key,
    wait: float | None,
) -> None:
    conn = via_bouncer()
    lock = pgsolo.session_lock(conn, key, wait=wait)
    with pytest.raises(UnsafeConnectionError) as caught:
        lock.acquire()
    assert_refusal_explains_itself(caught.value)
    assert not lock.acquired
    assert pgsolo.held_session_locks(conn) == []
    assert observer.holders(key) == set()
    # The hazard it prevents: through this bouncer another client lands on the same
    # backend, where a session lock would look free to it and held to both.
    other = via_bouncer()
    assert server_pid(other) == server_pid(conn)
    # The same connection still takes transaction-level locks, and refuses again.
    with pgsolo.xact_lock(conn, key) as xact:
        assert xact.acquired
    with pytest.raises(UnsafeConnectionError), pgsolo.session_lock(conn, key):
        pytest.fail("the block ran without a safe lock")
    assert observer.holders(key) == set()


@pytest.mark.usefixtures("busy")
def test_session_lock_through_a_busy_transaction_pooler_is_refused_every_time(
    via_bouncer: Callable[..., psycopg.Connection[Any]], observer: Any, key: Key
) -> None:
    for attempt in range(12):
        conn = via_bouncer()
        with pytest.raises(UnsafeConnectionError) as caught:
            pgsolo.session_lock(conn, key, wait=5).acquire()
        assert_refusal_explains_itself(caught.value)
        assert observer.holders(key) == set(), f"attempt {attempt} left the lock held"
        conn.close()


async def test_async_session_lock_through_a_transaction_pooler_is_refused(
    bouncer: Bouncer, observer: Any, key: Key
) -> None:
    conn = await psycopg.AsyncConnection.connect(
        bouncer.dsn, autocommit=True, prepare_threshold=None
    )
    async with conn:
        with pytest.raises(UnsafeConnectionError) as caught:
            async with pgsolo.session_lock(conn, key):
                pytest.fail("the block ran without a safe lock")
        assert_refusal_explains_itself(caught.value)
        assert observer.holders(key) == set()
        async with pgsolo.xact_lock(conn, key) as xact:
            assert xact.acquired


def test_pgsolo_run_through_a_transaction_pooler_exits_78_and_runs_nothing(
    bouncer: Bouncer, observer: Any, key: Key, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    done = subprocess.run(
        [
            *[sys.executable, "-m", "pgsolo", "run", "--key", key.text],
            *["--dsn", bouncer.dsn, "--json", "--"],
            *[sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == EXIT_UNSAFE, done.stderr
    assert not marker.exists()
    report = json_document(done.stderr)  # checked against its JSON Schema
    assert (report["outcome"], report["reason"]) == ("failed", "transaction-pooling")
    assert "pool_mode=session" in report["error"]["message"]
    assert observer.holders(key) == set()


# -- session pooling and plain relays: session locks work ------------------------------------


def test_session_lock_through_a_session_pooler_works_and_is_watched(
    session_bouncer: Bouncer, observer: Any, key: Key
) -> None:
    with bouncer_client(session_bouncer) as conn, bouncer_client(session_bouncer) as other:
        backend = server_pid(conn)
        keep = pgsolo.Keep(interval=0.05)
        with pgsolo.session_lock(conn, key, wait=5, keep=keep) as lock:
            assert lock.acquired
            assert observer.holders(key) == {backend}
            assert server_pid(other) != backend
            assert not pgsolo.session_lock(other, key).acquire()
            time.sleep(0.4)  # several beats through the bouncer
            assert not lock.lost
        assert observer.holders(key) == set()
        # Lost for real: the server session behind the bouncer ends.
        lock = pgsolo.session_lock(conn, key, keep=keep)
        lock.acquire()
        observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
        eventually(lambda: lock.lost, "the keeper to notice")
        assert pgsolo.session_lock(other, key).acquire()
        with pytest.raises(pgsolo.LockLostError) as caught:
            lock.release()
        assert caught.value is lock.loss
        assert caught.value.reason == "connection-lost"


def test_a_guarded_session_lock_in_a_failed_savepoint_costs_the_caller_that_savepoint_only(
    session_bouncer: Bouncer, observer: Any, key: Key
) -> None:
    """Behind a proxy the unlock runs only on the backend that holds the lock; in a
    transaction that failed in the block it runs in the statement that fails the
    transaction again, guarded all the same, and the caller's savepoint recovers the rest."""
    with bouncer_client(session_bouncer) as conn:
        conn.execute("CREATE TEMPORARY TABLE audit (note text)")
        with pgsolo.session_lock(conn, key):  # the route is checked outside a transaction
            pass

        def failing_block() -> None:
            with conn.transaction(), pgsolo.session_lock(conn, key, wait=5) as lock:
                assert lock.acquired
                assert observer.holders(key) == {server_pid(conn)}
                conn.execute("SELECT 1/0")

        with conn.transaction():
            conn.execute("INSERT INTO audit VALUES ('before')")
            with pytest.raises(psycopg.errors.DivisionByZero):
                failing_block()
            assert observer.holders(key) == set()
            conn.execute("INSERT INTO audit VALUES ('after')")
        notes = [row[0] for row in conn.execute("SELECT note FROM audit ORDER BY note")]
        assert notes == ["after", "before"]


def test_session_lock_through_a_plain_relay_works(
    dsn: str, observer: Any, key: Key, connect: Callable[..., psycopg.Connection[Any]]
) -> None:
    with Relay(dsn) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
        backend = server_pid(conn)
        assert conn.info.backend_pid == backend  # a relay passes the backend's pid on
        with pgsolo.session_lock(conn, key, keep=pgsolo.Keep(interval=0.05)) as lock:
            assert lock.acquired
            assert observer.holders(key) == {backend}
            assert not pgsolo.session_lock(connect(), key).acquire()
            time.sleep(0.3)
            assert not lock.lost
        assert observer.holders(key) == set()


# -- a connection moved to another session, as transaction pooling moves it ----------------


def moved(relay: Relay, conn: psycopg.Connection[Any], other: psycopg.Connection[Any]) -> None:
    """Hand ``conn`` the session of ``other`` (and ``other`` ``conn``'s), both idle."""
    ports = [pgsolo.drivers.adapt(c).client_address()[1] for c in (conn, other)]  # type: ignore[index]
    relay.swap(*ports)
    assert server_pid(conn) == other.info.backend_pid


def test_a_try_on_a_connection_moved_to_another_session_takes_nothing(
    dsn: str, observer: Any, key: Key
) -> None:
    """Behind a relay, a session lock's try runs only on the session the route was checked
    on (guarded by its pid). Once the connection was handed another session, the try
    takes nothing there: it is refused as transaction pooling, and nothing is held or on
    the books."""
    with (
        Relay(dsn) as relay,
        psycopg.connect(relay.dsn, autocommit=True) as conn,
        psycopg.connect(relay.dsn, autocommit=True) as other,
    ):
        with pgsolo.session_lock(conn, f"route-{uuid.uuid4()}"):
            pass  # the route, checked on conn's own session
        moved(relay, conn, other)
        with pytest.raises(UnsafeConnectionError, match="moved to another server session"):
            pgsolo.session_lock(conn, key).acquire()
        assert observer.holders(key) == set()
        assert pgsolo.held_session_locks(conn) == []


def test_an_unlock_on_a_connection_moved_to_another_session_says_where_the_lock_is(
    dsn: str, observer: Any, key: Key
) -> None:
    """The unlock of a session lock whose connection was handed another session runs
    nowhere (guarded), is tried once more from a second connection, which lands on yet
    another session here, and then says so: the lock is off the books, the error names
    the backend that still holds it and how to end it, and that backend does hold it."""
    with (
        Relay(dsn) as relay,
        psycopg.connect(relay.dsn, autocommit=True) as conn,
        psycopg.connect(relay.dsn, autocommit=True) as other,
    ):
        holder = conn.info.backend_pid
        lock = pgsolo.session_lock(conn, key)
        assert lock.acquire()
        moved(relay, conn, other)
        with pytest.raises(UnsafeConnectionError, match="reached another server session") as e:
            lock.release()
        assert f"pg_terminate_backend({holder})" in str(e.value)
        assert not lock.acquired
        assert pgsolo.held_session_locks(conn) == []
        assert observer.holders(key) == {holder}  # where the error says it is
        other.execute("SELECT pg_advisory_unlock_all()")  # other has conn's session now
        assert observer.holders(key) == set()


# -- found in review -----------------------------------------------------------------------


def test_reset_all_behind_a_relay_does_not_strand_a_held_lock(
    dsn: str, observer: Any, key: Key
) -> None:
    """RESET ALL keeps advisory locks but wipes pgsolo's session stamp; behind a proxy the
    guarded unlock then believes the connection moved, forgets the lock and leaves it held
    on this very (live) session."""

    with Relay(dsn) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
        lock = pgsolo.session_lock(conn, key)
        assert lock.acquire()
        conn.execute("RESET ALL")
        try:
            lock.release()
        finally:
            held = observer.holders(key)
            forgotten = pgsolo.held_session_locks(conn) == []
        assert held == set(), f"still held by {held}; pgsolo forgot it: {forgotten}"


# -- found by the chaos suite --------------------------------------------------------------


def test_a_second_connection_refused_during_the_route_check_is_database_unavailable(
    dsn: str, observer: Any, key: Key
) -> None:
    """Regression (issue 21, found by the chaos suite): behind a proxy, a session lock
    checks what answers the connection with a second connection of pgsolo's own; when
    that one could not be opened (there: the server restarting; here: a role allowed one
    connection), the driver's error came out raw, the caller's connection being alive.
    Now it is :class:`~pgsolo.DatabaseUnavailableError`, caused by the driver's error,
    nothing is held, and the caller's connection still works."""
    role = f"pgsolo_one_connection_{uuid.uuid4().hex[:10]}"
    password = "pgsolo-test-role-secret"  # noqa: S105 - a throwaway role's own
    observer.conn.execute(
        pgsql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1 PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    try:
        as_role = make_conninfo(dsn, user=role, password=password)
        with Relay(as_role) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
            with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
                pgsolo.session_lock(conn, key).acquire()
            assert isinstance(raised.value.__cause__, psycopg.OperationalError)
            assert password not in str(raised.value)
            assert observer.holders(key) == set()
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        observer.conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
