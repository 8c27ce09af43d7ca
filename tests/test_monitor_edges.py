"""Edge cases of pgsolo.monitor and its commands, found in review; each is a regression
test on a real server."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable

import psycopg

import pgsolo
from _support import DEADLINE, eventually, run_cli
from pgsolo import UsageError
from pgsolo.keys import Key, derive_int64
from pgsolo.monitor import advisory_locks, doctor, terminate_backend, wait_chains

Connect = Callable[..., psycopg.Connection]
BOUND = "-c statement_timeout=20000"


def in_background(conn: psycopg.Connection, statement: str) -> threading.Thread:
    def run() -> None:
        with contextlib.suppress(psycopg.Error):
            conn.execute(statement)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_deadlock_cycle_is_shown_as_a_wait_chain(connect: Connect, observer: object) -> None:
    """wait_chains promises that "a cycle (a deadlock PostgreSQL has not broken yet) ends
    where a pid would repeat", but it only starts chains at waiters nobody waits on: in a
    pure cycle every waiter is waited on, so nothing at all is shown - the one situation
    where the on-call engineer most needs the chain. (deadlock_timeout raised so that the
    server does not break the cycle during the test; needs a superuser.)"""
    first, second = Key((7_200_001, 1)), Key((7_200_001, 2))
    slow = f"{BOUND} -c deadlock_timeout=60s"
    a, b = connect(options=slow), connect(options=slow)
    a.execute(f"SELECT pg_advisory_lock({first.sql_args})")
    b.execute(f"SELECT pg_advisory_lock({second.sql_args})")
    pa, pb = a.info.backend_pid, b.info.backend_pid
    threads = [in_background(a, f"SELECT pg_advisory_lock({second.sql_args})")]
    eventually(lambda: observer.waiters(second), "a to wait for b")  # type: ignore[attr-defined]
    threads.append(in_background(b, f"SELECT pg_advisory_lock({first.sql_args})"))
    eventually(lambda: observer.waiters(first), "b to wait for a")  # type: ignore[attr-defined]
    try:
        locks = [lock for lock in advisory_locks(connect()) if lock.pid in (pa, pb)]
        assert {(lock.pid, lock.blocked_by) for lock in locks if not lock.granted} == {
            (pa, (pb,)),
            (pb, (pa,)),
        }
        chains = wait_chains(locks)
        assert chains, "a two-backend deadlock cycle shows no wait chain at all"
    finally:
        for pid in (pa, pb):
            observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # type: ignore[attr-defined]
        for thread in threads:
            thread.join(DEADLINE)


def test_terminate_refuses_a_pid_that_only_waits_and_never_claims_it_released_locks(
    connect: Connect, observer: object, dsn: str
) -> None:
    """Issue 5: terminate "refuses pids that hold no advisory lock unless --force". A
    backend that only waits holds none, yet it is terminated without --force and the
    command reports "1 advisory lock(s) released"."""
    k = Key((7_200_002, 1))
    holder, waiter = connect(), connect(options=BOUND)
    holder.execute(f"SELECT pg_advisory_lock({k.sql_args})")
    thread = in_background(waiter, f"SELECT pg_advisory_lock({k.sql_args})")
    eventually(lambda: observer.waiters(k), "the waiter to wait")  # type: ignore[attr-defined]
    pid = waiter.info.backend_pid
    try:
        done = run_cli("terminate", str(pid), "--yes", "--dsn", dsn)
        assert "released" not in done.stdout, done.stdout
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    finally:
        observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # type: ignore[attr-defined]
        thread.join(DEADLINE)


def test_locks_key_given_by_name_is_shown_with_that_name(connect: Connect, dsn: str) -> None:
    """`pgsolo locks --key review2-job` filters on the name's key but leaves the NAME
    column empty: the name the user typed is not used to label the rows it selected."""
    name = "review2-job-name"
    holder = connect()
    holder.execute(f"SELECT pg_advisory_lock({derive_int64(name)})")
    done = run_cli("locks", "--key", name, "--json", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["locks"]
    assert [row["key"] for row in rows] == [str(derive_int64(name))]
    assert rows[0]["name"] == name, rows[0]


def test_measure_ten_thousand_locks(connect: Connect) -> None:
    """Not a bug: the time of one advisory_locks() call with 10,000 locks held."""
    holders = [connect() for _ in range(4)]
    for index, conn in enumerate(holders):
        conn.execute(
            "SELECT count(pg_advisory_lock(7300000, i)) FROM generate_series(%s::int, %s::int) i",
            (index * 2500, index * 2500 + 2499),
        )
    monitor = connect()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        locks = advisory_locks(monitor)
        times.append(time.perf_counter() - started)
    mine = [
        lock for lock in locks if isinstance(lock.key.value, tuple) and lock.key.value[0] == 7300000
    ]
    assert len(mine) == 10_000
    assert {lock.lifetime for lock in mine} == {"session"}
    print(f"\n10,000 locks: advisory_locks() {sorted(times)}")


def test_terminate_backend_refuses_its_own_connection_before_any_sql(connect: Connect) -> None:
    """The CLI refuses its own pid; the Python API sends pg_terminate_backend(own pid),
    which kills the caller's own connection and surfaces as a raw OperationalError."""

    conn = connect()
    try:
        terminate_backend(conn, conn.info.backend_pid)
    except UsageError:
        pass
    except Exception as exc:
        raise AssertionError(f"not a typed usage error: {exc!r}") from exc
    else:
        raise AssertionError("terminated its own session and returned")
    assert not conn.closed


def test_doctor_does_not_fail_lock_timeout_for_pgsolos_own_bounded_waits(
    connect: Connect, observer: object
) -> None:
    """pgsolo's waits bound themselves (SET LOCAL lock_timeout in the same message as the
    lock, visible in pg_stat_activity.query), yet doctor counts a pgsolo waiter like a raw
    pg_advisory_lock() and reports 'fail ... a job that hangs rather than skips' once it
    has waited longer than --older-than."""

    k = Key((7_200_003, 1))
    holder, waiter = connect(), connect(application_name="pgsolo:bounded")
    holder.execute(f"SELECT pg_advisory_lock({k.sql_args})")

    def wait_bounded() -> None:
        with contextlib.suppress(pgsolo.PgsoloError), pgsolo.session_lock(waiter, k, wait=8):
            pass

    thread = threading.Thread(target=wait_bounded, daemon=True)
    thread.start()
    eventually(lambda: observer.waiters(k), "the pgsolo waiter to wait")  # type: ignore[attr-defined]
    time.sleep(0.5)
    try:
        checks = {c.name: c for c in doctor(connect(), older_than=0.2)}
        check = checks["lock-timeout"]
        assert check.status != "fail", check
    finally:
        holder.execute(f"SELECT pg_advisory_unlock({k.sql_args})")
        thread.join(DEADLINE)
