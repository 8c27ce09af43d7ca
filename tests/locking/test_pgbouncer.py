"""Transaction-level locks behind a real PgBouncer in ``pool_mode=transaction``.

The README says "transaction-level locks are safe behind any pooler". Here that is
checked end to end: a real ``pgbouncer`` process (Debian's package in CI, found through
``PGSOLO_PGBOUNCER_BIN``) sits in front of the test server, every pgsolo call goes
through it, and what is asserted is what the server itself shows (``pg_locks`` and
``pg_stat_activity`` through the ``observer`` session, which connects directly), plus
the values and errors the callers get.

Session locks through PgBouncer (refused in transaction mode, working in session mode)
are tested in test_proxy.py.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import DEADLINE, IDLE, INTRANS, eventually, new_job, run_threads, server_pid
from pgsolo import Key, LockTimeoutError
from pgsolo.keys import encode_pg_lock
from pgsolo.testing import POOL_SIZE, Bouncer

# -- helpers --------------------------------------------------------------------------------


def held_here(conn: psycopg.Connection, key: Key) -> bool:
    """Whether the backend running this statement holds ``key``, per ``pg_locks``."""
    classid, objid, objsubid = encode_pg_lock(key)
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND pid = pg_backend_pid() AND classid::bigint = %s AND objid::bigint = %s"
        " AND objsubid = %s)",
        (classid, objid, objsubid),
    ).fetchone()
    assert row is not None
    return bool(row[0])


# -- 0. the setup really is transaction pooling ----------------------------------------------


def test_the_bouncer_pools_per_transaction(via_bouncer: Any, observer: Any) -> None:
    """Without this, the tests below could pass against a session pooler or a direct
    connection. A client's consecutive statements must be able to land on different
    server sessions: X's backend is handed to Y's transaction, so X moves."""
    x, y = via_bouncer(), via_bouncer()
    moved = False
    for _ in range(POOL_SIZE + 1):
        first = server_pid(x)
        with y.transaction():
            taken = server_pid(y)
            second = server_pid(x)
        assert second != taken  # Y's open transaction keeps its backend to itself
        if second != first:
            moved = True
            break
    assert moved, "client X stayed on one server backend: this is not transaction pooling"
    assert x.info.port != observer.conn.info.port or x.info.host != observer.conn.info.host


# -- 1. the article's scenario ------------------------------------------------------------


def test_xact_lock_article_scenario_through_pgbouncer(
    via_bouncer: Any, observer: Any, key: Key
) -> None:
    a, b = via_bouncer(), via_bouncer()
    with pgsolo.xact_lock(a, key) as lock_a:
        assert lock_a.acquired
        assert a.info.transaction_status == INTRANS
        holder = server_pid(a)  # the same server session as the lock: one transaction
        assert observer.holders(key) == {holder}
        assert held_here(a, key)
        row = observer.conn.execute(
            "SELECT backend_type, state FROM pg_stat_activity WHERE pid = %s", (holder,)
        ).fetchone()
        assert row == ("client backend", "idle in transaction")

        with pgsolo.xact_lock(b, key) as lock_b:
            assert lock_b.acquired is False
        assert b.info.transaction_status == IDLE
        assert observer.holders(key) == {holder}  # B's try changed nothing

    assert a.info.transaction_status == IDLE
    assert observer.holders(key) == set()
    assert observer.waiters(key) == set()

    with pgsolo.xact_lock(b, key) as lock_b:
        assert lock_b.acquired is True
        assert observer.holders(key) == {server_pid(b)}
    assert observer.holders(key) == set()


# -- 2. many threads, each with its own client connection ----------------------------------


@pytest.mark.parametrize("wait", [None, DEADLINE], ids=["try", "wait"])
def test_threads_racing_through_pgbouncer_never_hold_together(
    via_bouncer: Any, observer: Any, key: Key, wait: float | None
) -> None:
    n_threads, rounds = 12, 15 if wait is None else 4
    conns = [via_bouncer() for _ in range(n_threads)]
    guard = threading.Lock()
    inside = 0
    most_inside = 0
    entries = 0
    not_held_inside: list[int] = []
    start = threading.Barrier(n_threads, timeout=DEADLINE)
    finished = threading.Event()

    def worker(conn: psycopg.Connection) -> None:
        nonlocal inside, most_inside, entries
        start.wait()
        for _ in range(rounds):
            with pgsolo.xact_lock(conn, key, wait=wait) as lock:
                if not lock.acquired:
                    continue
                with guard:
                    inside += 1
                    entries += 1
                    most_inside = max(most_inside, inside)
                try:
                    # The block's own statements run on the session that holds the lock.
                    if not held_here(conn, key):
                        not_held_inside.append(server_pid(conn))
                finally:
                    with guard:
                        inside -= 1

    # The server's view, sampled from outside while the threads race.
    most_holders = 0

    def watch() -> None:
        nonlocal most_holders
        while not finished.is_set():
            most_holders = max(most_holders, len(observer.holders(key)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        errors = run_threads([lambda c=c: worker(c) for c in conns], timeout=45.0)
    finally:
        finished.set()
        watcher.join(DEADLINE)
    assert not watcher.is_alive()
    assert errors == []
    assert most_inside == 1
    assert most_holders <= 1
    assert not_held_inside == []
    if wait is None:
        assert entries >= 1
    else:
        assert entries == n_threads * rounds
    assert all(c.info.transaction_status == IDLE for c in conns)
    assert observer.holders(key) == set()
    assert observer.waiters(key) == set()


# -- 3. pgsolo's multi-statement messages through the bouncer --------------------------------


def pooled_lock_timeouts(via_bouncer: Any) -> tuple[set[tuple[str, str]], set[int]]:
    """``(lock_timeout, its session default)`` on every server session of the pool: as
    many transactions at once as the pool has sessions, so each one is looked at."""
    clients = [via_bouncer() for _ in range(POOL_SIZE)]
    seen: set[tuple[str, str]] = set()
    pids: set[int] = set()
    try:
        for c in clients:
            c.execute("BEGIN")
            row = c.execute(
                "SELECT current_setting('lock_timeout'), reset_val, pg_backend_pid()"
                " FROM pg_settings WHERE name = 'lock_timeout'"
            ).fetchone()
            assert row is not None
            seen.add((str(row[0]), str(row[1])))
            pids.add(int(row[2]))
    finally:
        for c in clients:
            if c.info.transaction_status != IDLE:
                c.execute("ROLLBACK")
    return seen, pids


def test_wait_timeout_through_pgbouncer_leaves_nothing_behind(
    via_bouncer: Any, observer: Any, key: Key
) -> None:
    row = observer.conn.execute("SHOW lock_timeout").fetchone()
    assert row is not None
    default = str(row[0])
    h, b = via_bouncer(), via_bouncer()

    with pgsolo.xact_lock(h, key) as held:
        assert held.acquired
        holder = server_pid(h)

        # BEGIN; save lock_timeout; SET LOCAL; pg_advisory_xact_lock; restore: one message
        started = time.monotonic()
        with pytest.raises(LockTimeoutError) as info, pgsolo.xact_lock(b, key, wait=0.3):
            pytest.fail("the block must not run: the lock is held")
        assert time.monotonic() - started < DEADLINE
        assert info.value.key == key
        assert info.value.timeout == pytest.approx(0.3)
        assert b.info.transaction_status == IDLE
        assert observer.holders(key) == {holder}
        assert observer.waiters(key) == set()

        # The client connection is usable, and its next transaction has the default.
        with b.transaction():
            row = b.execute("SHOW lock_timeout").fetchone()
            assert row == (default,)

        # The savepoint variant, inside the caller's transaction: it stays usable.
        with b.transaction():
            with pytest.raises(LockTimeoutError):
                pgsolo.xact_lock(b, key, wait=0.3).acquire()
            assert b.info.transaction_status == INTRANS
            assert b.execute("SHOW lock_timeout").fetchone() == (default,)
            assert not held_here(b, key)
        assert b.info.transaction_status == IDLE
        assert observer.holders(key) == {holder}

        # A wait that succeeds: really waiting on the server, then granted on release.
        result: dict[str, object] = {}
        in_block = threading.Event()
        leave = threading.Event()

        def waiter() -> None:
            with pgsolo.xact_lock(b, key, wait=DEADLINE * 3) as lock:
                result["acquired"] = lock.acquired
                result["pid"] = server_pid(b)
                result["lock_timeout"] = b.execute("SHOW lock_timeout").fetchone()
                in_block.set()
                leave.wait(DEADLINE)

        thread = threading.Thread(target=waiter, daemon=True)
        thread.start()
        waiting = eventually(lambda: observer.waiters(key), "B waiting on the server")
        assert holder not in waiting
    # H's block committed: B is granted.
    try:
        assert in_block.wait(DEADLINE), "B was not granted the lock after H committed"
        assert result["acquired"] is True
        assert result["pid"] in waiting
        assert result["lock_timeout"] == (default,)  # restored in the same message
        assert observer.holders(key) == {result["pid"]}
    finally:
        leave.set()
        thread.join(DEADLINE)
    assert not thread.is_alive()
    assert observer.holders(key) == set()

    # Nothing leaked into any pooled server session.
    seen, pids = pooled_lock_timeouts(via_bouncer)
    assert seen == {(default, default)}
    assert len(pids) == POOL_SIZE
    assert b.execute("SELECT 1").fetchone() == (1,)


# -- 4. jobs through the bouncer --------------------------------------------------------------


@pytest.fixture(scope="module")
def migrated(dsn: str) -> None:
    """pgsolo's tables, created over a direct connection (DDL is not the point here)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgsolo.migrate(conn)


def test_run_job_through_pgbouncer_completes(
    bouncer: Bouncer, observer: Any, migrated: None
) -> None:
    job = new_job("pgbouncer-test")
    job_key = pgsolo.as_key(job)
    seen: dict[str, object] = {}

    def work(conn: psycopg.Connection) -> int:
        pid = server_pid(conn)
        seen["held_here"] = held_here(conn, job_key)
        seen["holders"] = observer.holders(job_key)
        return pid

    result = pgsolo.run_job(bouncer.dsn, job, work)
    assert result.outcome == "completed", result
    assert seen == {"held_here": True, "holders": {result.value}}
    assert observer.holders(job_key) == set()

    # And once per period, recorded through the bouncer too.
    result = pgsolo.run_job(bouncer.dsn, job, work, period="day")
    assert result.outcome == "completed", result
    again = pgsolo.run_job(bouncer.dsn, job, work, period="day")
    assert (again.outcome, again.reason) == ("skipped", "already-done-this-period")
    rows = observer.conn.execute(
        "SELECT count(*) FROM pgsolo.job_periods WHERE job = %s", (job,)
    ).fetchone()
    assert rows == (1,)


@pytest.mark.parametrize("wait", [None, DEADLINE * 2], ids=["try", "wait"])
def test_same_job_once_per_period_from_many_threads_through_pgbouncer(
    bouncer: Bouncer, observer: Any, migrated: None, wait: float | None
) -> None:
    job = new_job("pgbouncer-test")
    n_threads = 8
    calls: list[int] = []
    results: list[pgsolo.JobResult[Any]] = []
    start = threading.Barrier(n_threads, timeout=DEADLINE)

    def work(conn: psycopg.Connection) -> int:
        calls.append(server_pid(conn))
        time.sleep(0.05)  # widens the window for the others; not a synchronisation
        return len(calls)

    def attempt() -> None:
        start.wait()
        results.append(pgsolo.run_job(bouncer.dsn, job, work, period="day", wait=wait))

    errors = run_threads([attempt] * n_threads, timeout=45.0)
    assert errors == []
    outcomes = collections.Counter((r.outcome, r.reason) for r in results)
    assert outcomes[("completed", None)] == 1, outcomes
    assert len(calls) == 1
    allowed = {("completed", None), ("skipped", "already-done-this-period")}
    if wait is None:
        allowed.add(("skipped", "busy"))
    else:  # everyone got the lock in turn and found the period done
        assert outcomes[("skipped", "already-done-this-period")] == n_threads - 1, outcomes
    assert set(outcomes) <= allowed, outcomes
    assert sum(outcomes.values()) == n_threads
    rows = observer.conn.execute(
        "SELECT count(*) FROM pgsolo.job_periods WHERE job = %s", (job,)
    ).fetchone()
    assert rows == (1,)
    assert observer.holders(pgsolo.as_key(job)) == set()
