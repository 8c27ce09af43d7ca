"""``doctor()``: each check passes and fails for real, on a database of its own (idle
sessions holding locks, long transactions, the lock table filling up, idle timeouts,
lock_timeout, PUBLIC execute on the lock functions), and the proxy check through direct
connections, relays and PgBouncer in both pooling modes.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import sql as pgsql

import pgsolo
from _support import DEADLINE, STATEMENT_BOUND, Connect, closing_all, eventually, in_background
from pgsolo import Check, Key, doctor
from pgsolo.locking import waits
from pgsolo.testing import Bouncer, Relay


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


@pytest.fixture
def fresh(fresh_db: str) -> Iterator[Callable[..., psycopg.Connection]]:
    """Connections to the test's own database (autocommit), closed afterwards."""
    with closing_all(functools.partial(psycopg.connect, fresh_db, autocommit=True)) as opener:
        yield opener


def alter_database(admin: psycopg.Connection, setting: str, value: str) -> None:
    admin.execute(
        pgsql.SQL("ALTER DATABASE {} SET {} = {}").format(
            pgsql.Identifier(admin.info.dbname), pgsql.Identifier(setting), pgsql.Literal(value)
        )
    )


def test_a_quiet_database_passes_every_check_but_public_execute(
    fresh: Callable[..., psycopg.Connection],
) -> None:
    checks = doctor(fresh(application_name="doctor"))
    assert [c.name for c in checks] == [
        "primary",
        "idle-session-locks",
        "transaction-locks",
        "vacuum-horizon",
        "lock-table-capacity",
        "application-name",
        "idle-timeouts",
        "lock-timeout",
        "proxy",
        "public-execute",
        "visibility",
        "leaders",
    ]
    statuses = {c.name: c.status for c in checks}
    assert statuses.pop("public-execute") == "warn"  # PostgreSQL's default
    assert set(statuses.values()) == {"ok"}, checks


def test_idle_session_holding_a_lock_is_a_leak_suspect(
    fresh: Callable[..., psycopg.Connection],
) -> None:
    holder = fresh(application_name="leaky-worker")
    holder.execute("SELECT pg_advisory_lock(1), pg_advisory_lock(1, 2)")
    conn = fresh()
    assert by_name(doctor(conn, older_than=3600))["idle-session-locks"].status == "ok"
    check = eventually(
        lambda: (
            (c := by_name(doctor(conn, older_than=0.2))["idle-session-locks"]).status == "warn"
            and c
        ),
        "the idle holder to be flagged",
    )
    assert f"pid {holder.info.backend_pid} ('leaky-worker'" in check.detail
    assert "2 held" in check.detail
    assert "pgsolo terminate" in check.advice


def test_idle_in_transaction_holding_a_lock_fails_and_a_long_one_warns(
    fresh: Callable[..., psycopg.Connection], observer: object
) -> None:
    stuck = fresh(application_name="stuck")
    stuck.execute("BEGIN")
    stuck.execute("SELECT pg_advisory_xact_lock(5)")
    conn = fresh()
    assert by_name(doctor(conn, older_than=3600))["transaction-locks"].status == "ok"
    check = eventually(
        lambda: (
            (c := by_name(doctor(conn, older_than=0.2))["transaction-locks"]).status == "fail" and c
        ),
        "the idle transaction to fail the check",
    )
    assert f"pid {stuck.info.backend_pid} ('stuck'" in check.detail
    stuck.execute("ROLLBACK")

    busy = fresh(application_name="busy", options=STATEMENT_BOUND)
    busy.execute("BEGIN")
    busy.execute("SELECT pg_advisory_xact_lock(6)")
    sleeper = in_background(busy, "SELECT pg_sleep(60)")
    try:
        check = eventually(
            lambda: (
                (c := by_name(doctor(conn, older_than=0.2))["transaction-locks"]).status == "warn"
                and c
            ),
            "the long transaction to warn",
        )
        assert f"pid {busy.info.backend_pid} ('busy'" in check.detail
    finally:
        observer.conn.execute("SELECT pg_cancel_backend(%s)", (busy.info.backend_pid,))  # type: ignore[attr-defined]
        sleeper.join(DEADLINE)


def test_a_session_holding_an_old_snapshot_holds_back_vacuum(
    fresh: Callable[..., psycopg.Connection],
) -> None:
    """Guards issue 22: a session whose transaction holds a snapshot (REPEATABLE READ,
    after its first query) holds back VACUUM in the whole database, advisory locks or
    not: doctor names it (pid, application_name, state, age, what it holds, its query)
    once it is older than snapshot_older_than, and no longer once it ends."""
    reader = fresh(application_name="report-reader")
    reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute("SELECT count(*) FROM pg_class")  # the transaction's snapshot
    conn = fresh()
    assert by_name(doctor(conn))["vacuum-horizon"].status == "ok"  # 60 s by default
    check = eventually(
        lambda: (
            (c := by_name(doctor(conn, snapshot_older_than=0.2))["vacuum-horizon"]).status == "warn"
            and c
        ),
        "the old snapshot to be flagged",
    )
    pid = reader.info.backend_pid
    # over TCP the client's address follows the name: ('report-reader' from 127.0.0.1)
    assert f"pid {pid} ('report-reader'" in check.detail
    assert ") idle in transaction for" in check.detail
    assert "holding a snapshot, query 'SELECT count(*) FROM pg_class'" in check.detail
    assert "idle_in_transaction_session_timeout" in check.advice
    # The check is the database's, not the advisory locks': the reader holds none.
    assert by_name(doctor(conn, older_than=0.2))["transaction-locks"].status == "ok"
    reader.execute("ROLLBACK")
    assert by_name(doctor(conn, snapshot_older_than=0.2))["vacuum-horizon"].status == "ok"


def test_a_pgsolo_waiter_never_holds_back_vacuum(
    fresh: Callable[..., psycopg.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Guards issue 22: a pgsolo waiter waits in slices, so however long it waits doctor
    never finds it holding back VACUUM for longer than a slice (one statement for the
    whole wait did, and doctor said all was well)."""
    monkeypatch.setattr(waits, "WAIT_SLICE_SECONDS", 0.3)
    k = Key((7_200_004, 1))
    holder, waiter = fresh(), fresh(application_name="standby")
    holder.execute(f"SELECT pg_advisory_lock({k.sql_args})")

    def wait_long() -> None:
        with contextlib.suppress(pgsolo.PgsoloError), pgsolo.session_lock(waiter, k, wait=30):
            pass

    thread = threading.Thread(target=wait_long, daemon=True)
    thread.start()
    try:
        conn = fresh()
        ends = time.monotonic() + 2.0
        while time.monotonic() < ends:
            check = by_name(doctor(conn, snapshot_older_than=1.0))["vacuum-horizon"]
            assert check.status == "ok", check
            time.sleep(0.1)
    finally:
        holder.execute(f"SELECT pg_advisory_unlock({k.sql_args})")
        thread.join(DEADLINE)


def test_lock_table_capacity_warns_and_fails_as_it_fills(
    fresh: Callable[..., psycopg.Connection],
) -> None:
    conn = fresh()
    capacity = conn.execute(
        "SELECT current_setting('max_locks_per_transaction')::int * (current_setting("
        "'max_connections')::int + current_setting('max_prepared_transactions')::int)"
    ).fetchone()[0]  # type: ignore[index]
    if capacity > 20_000:
        pytest.skip(f"the server's lock table ({capacity}) is too large to fill in a test")
    assert by_name(doctor(conn))["lock-table-capacity"].status == "ok"
    holder = fresh()
    for share, status in ((0.5, "warn"), (0.9, "fail")):
        holder.execute("SELECT pg_advisory_unlock_all()")
        count = math.ceil(capacity * share) + 1
        holder.execute(
            f"SELECT count(pg_advisory_lock(7100005, g)) FROM generate_series(1, {count}) g"
        )
        check = by_name(doctor(conn))["lock-table-capacity"]
        assert check.status == status, check
        used = int(check.detail.split(" advisory locks")[0])
        assert count <= used < count + 100, check.detail  # a few from elsewhere at most
    holder.execute("SELECT pg_advisory_unlock_all()")
    assert by_name(doctor(conn))["lock-table-capacity"].status == "ok"


def test_lock_holders_without_an_application_name_are_named(
    fresh: Callable[..., psycopg.Connection],
) -> None:
    named = fresh(application_name="billing-worker")
    named.execute("SELECT pg_advisory_lock(8)")
    conn = fresh(application_name="doctor")
    assert by_name(doctor(conn))["application-name"].status == "ok"
    anonymous = fresh(application_name="")
    anonymous.execute("SELECT pg_advisory_lock(9)")
    check = by_name(doctor(conn))["application-name"]
    assert check.status == "warn"
    assert f"pid {anonymous.info.backend_pid} (no application_name" in check.detail
    assert "billing-worker" not in check.detail


def test_idle_timeouts_that_end_lock_holders(fresh: Callable[..., psycopg.Connection]) -> None:
    admin = fresh()
    assert by_name(doctor(fresh()))["idle-timeouts"].status == "ok"
    alter_database(admin, "idle_in_transaction_session_timeout", "10min")
    check = by_name(doctor(fresh()))["idle-timeouts"]
    assert check.status == "warn"
    assert (
        "idle_in_transaction_session_timeout=10m00s for this session (from database)"
        in check.detail
    )
    alter_database(admin, "idle_session_timeout", "1h")
    check = by_name(doctor(fresh()))["idle-timeouts"]
    assert check.status == "fail"
    assert "idle_session_timeout=1h00m" in check.detail
    assert "idle_session_timeout = 0" in check.advice


def test_lock_timeout_when_sessions_wait(
    fresh: Callable[..., psycopg.Connection], observer: object
) -> None:
    holder = fresh()
    holder.execute("SELECT pg_advisory_lock(10)")
    conn = fresh()
    assert by_name(doctor(conn))["lock-timeout"].status == "ok"  # nobody waits
    waiter = fresh(options=STATEMENT_BOUND)
    thread = in_background(waiter, "SELECT pg_advisory_lock(10)")
    try:
        eventually(lambda: observer.waiters(Key(10)), "the waiter to wait")  # type: ignore[attr-defined]
        assert by_name(doctor(conn, older_than=3600))["lock-timeout"].status == "warn"
        check = eventually(
            lambda: (
                (c := by_name(doctor(conn, older_than=0.2))["lock-timeout"]).status == "fail" and c
            ),
            "the long wait to fail the check",
        )
        assert f"pid {waiter.info.backend_pid}" in check.detail
        alter_database(fresh(), "lock_timeout", "5s")
        check = by_name(doctor(fresh(), older_than=0.2))["lock-timeout"]
        assert check.status == "ok"
        assert "lock_timeout=5.0s for this session (from database)" in check.detail
    finally:
        holder.close()
        thread.join(DEADLINE)


def test_public_execute_on_the_lock_functions(fresh: Callable[..., psycopg.Connection]) -> None:
    admin = fresh()
    check = by_name(doctor(admin))["public-execute"]
    assert check.status == "warn"
    assert "pg_advisory_lock(bigint)" in check.advice
    assert "FROM PUBLIC" in check.advice
    admin.execute(check.advice.removeprefix("in this database: ").split(";")[0])
    assert by_name(doctor(fresh()))["public-execute"].status == "ok"
    admin.execute("GRANT EXECUTE ON FUNCTION pg_try_advisory_xact_lock(bigint) TO PUBLIC")
    check = by_name(doctor(fresh()))["public-execute"]
    assert check.status == "warn"
    assert "pg_try_advisory_xact_lock(bigint)" in check.advice
    assert "pg_advisory_lock(bigint)" not in check.advice


def test_a_direct_connection_passes_the_proxy_check(connect: Connect) -> None:
    check = by_name(doctor(connect()))["proxy"]
    assert check.status == "ok"


def test_a_relay_that_pins_the_session_passes_and_is_named(dsn: str) -> None:
    with Relay(dsn) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
        check = by_name(doctor(conn))["proxy"]
    assert check.status == "ok", check
    assert "a proxy or NAT sits between" in check.detail


def test_a_transaction_pooling_pgbouncer_fails_the_proxy_check(bouncer: Bouncer) -> None:
    with psycopg.connect(bouncer.dsn, autocommit=True, prepare_threshold=None) as conn:
        check = by_name(doctor(conn))["proxy"]
    assert check.status == "fail", check
    assert "transaction-pooling proxy" in check.detail
    assert "pool_mode=session" in check.advice


def test_a_session_pooling_pgbouncer_passes_the_proxy_check(session_bouncer: Bouncer) -> None:
    with psycopg.connect(session_bouncer.dsn, autocommit=True, prepare_threshold=None) as conn:
        check = by_name(doctor(conn))["proxy"]
    assert check.status == "ok", check


# -- found in review -----------------------------------------------------------------------


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
