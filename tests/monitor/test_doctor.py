"""The monitor's Python API on a real server: ``advisory_locks``, ``wait_chains``, ``doctor``.

Locks are taken with raw SQL by other sessions, the way any client would take them, and
what the monitor reports is checked against what those sessions did. Each doctor check
is made to pass and to fail for real: settings are changed with ALTER DATABASE in a
database of the test's own (``fresh_db``), so no other test's sessions or settings can
change the verdict.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

import pgsolo
from _bouncer import Bouncer
from _relay import FreezingProxy
from _support import DEADLINE, eventually
from pgsolo import AdvisoryLock, Check, Key, Registry, advisory_locks, doctor, wait_chains
from pgsolo.errors import InvalidArgumentError, InvalidKeyError
from pgsolo.keys import derive_int32, derive_int64

Connect = Callable[..., psycopg.Connection]
STATEMENT_BOUND = "-c statement_timeout=60000"  # no raw blocking wait in a test outlives this


def mine(conn: psycopg.Connection, *pids: int, key: Key | None = None) -> list[AdvisoryLock]:
    return [lock for lock in advisory_locks(conn, key=key) if lock.pid in pids]


def in_background(conn: psycopg.Connection, statement: str) -> threading.Thread:
    """Run a (blocking) statement on ``conn`` in a thread; errors there are ignored, the
    test asserts what the server shows."""

    def run() -> None:
        with contextlib.suppress(psycopg.Error):
            conn.execute(statement)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {check.name: check for check in checks}


# -- advisory_locks ----------------------------------------------------------------------


def test_every_kind_of_key_is_decoded_with_its_mode_and_lifetime(
    connect: Connect, observer: object
) -> None:
    session = connect(application_name="kinds-session")
    session.execute(
        "SELECT pg_advisory_lock(123456789012), pg_advisory_lock(-2533923874772390729),"
        " pg_advisory_lock_shared(-1, -2), pg_advisory_lock(2147483647, -2147483648)"
    )
    xact = connect(autocommit=False, application_name="kinds-xact")
    xact.execute("SELECT pg_advisory_xact_lock(-9223372036854775808), pg_advisory_lock(77, -77)")
    monitor = connect()

    rows = {
        (lock.key, lock.pid): lock
        for lock in mine(monitor, session.info.backend_pid, xact.info.backend_pid)
    }
    s, x = session.info.backend_pid, xact.info.backend_pid
    expected = {
        (Key(123456789012), s): (False, "session"),
        (Key(-2533923874772390729), s): (False, "session"),
        (Key((-1, -2)), s): (True, "session"),
        (Key((2147483647, -2147483648)), s): (False, "session"),
        # In an open transaction PostgreSQL cannot tell an xact lock from a session one.
        (Key(-9223372036854775808), x): (False, None),
        (Key((77, -77)), x): (False, None),
    }
    assert {k: (v.shared, v.lifetime) for k, v in rows.items()} == expected
    assert all(lock.granted and lock.blocked_by == () for lock in rows.values())
    held = rows[(Key((-1, -2)), s)]
    assert held.application_name == "kinds-session"
    assert held.state == "idle"
    assert held.since_source == "state_change"
    assert held.age_seconds is not None
    assert held.age_seconds >= 0
    assert held.query is not None
    assert "pg_advisory_lock_shared(-1, -2)" in held.query
    assert held.database == monitor.info.dbname
    in_xact = rows[(Key((77, -77)), x)]
    assert (in_xact.state, in_xact.since_source) == ("idle in transaction", "xact_start")
    assert in_xact.as_dict()["key"] == "77:-77"
    assert in_xact.as_dict()["mode"] == "exclusive"


def test_a_three_deep_wait_chain_is_shown_in_order(connect: Connect, observer: object) -> None:
    first, second = Key((7_100_001, 1)), Key((7_100_001, 2))
    a = connect(application_name="chain-a")
    b = connect(application_name="chain-b", options=STATEMENT_BOUND)
    c = connect(application_name="chain-c", options=STATEMENT_BOUND)
    a.execute(f"SELECT pg_advisory_lock({first.sql_args})")
    b.execute(f"SELECT pg_advisory_lock({second.sql_args})")
    threads = [in_background(b, f"SELECT pg_advisory_lock({first.sql_args})")]
    eventually(lambda: observer.waiters(first), "b to wait for a")  # type: ignore[attr-defined]
    threads.append(in_background(c, f"SELECT pg_advisory_lock_shared({second.sql_args})"))
    eventually(lambda: observer.waiters(second), "c to wait for b")  # type: ignore[attr-defined]
    pa, pb, pc = (conn.info.backend_pid for conn in (a, b, c))
    try:
        locks = mine(connect(), pa, pb, pc)
        assert [(lock.key, lock.pid, lock.granted, lock.blocked_by) for lock in locks] == [
            (first, pa, True, ()),
            (first, pb, False, (pa,)),
            (second, pb, True, ()),
            (second, pc, False, (pb,)),
        ]
        waiting = [lock for lock in locks if not lock.granted]
        assert all(lock.since_source == "waitstart" for lock in waiting)
        assert [lock.shared for lock in waiting] == [False, True]
        assert wait_chains(locks) == [(pc, pb, pa)]
    finally:
        for pid in (pb, pc):
            observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # type: ignore[attr-defined]
        for thread in threads:
            thread.join(DEADLINE)


def test_names_come_from_a_registry_file_and_from_given_names(
    connect: Connect, tmp_path: Path
) -> None:
    registry_file = tmp_path / "locks.toml"
    registry_file.write_text(
        "[namespaces]\njobs = 7100002\n\n[locks]\nnightly-report = [7100002, 5]\n"
        "cache-refresh = -7100002\n",
        encoding="utf-8",
    )
    registry = Registry.from_toml(registry_file)
    holder = connect()
    holder.execute(
        "SELECT pg_advisory_lock(7100002, 5), pg_advisory_lock(-7100002),"
        f" pg_advisory_lock({derive_int64('daily-settlement')}),"
        f" pg_advisory_lock(7100003, {derive_int32('tenant-export')}), pg_advisory_lock(7100002, 6)"
    )
    monitor = connect()
    locks = advisory_locks(monitor, registry=registry, names=["daily-settlement", "tenant-export"])
    names = {lock.key.text: lock.name for lock in locks if lock.pid == holder.info.backend_pid}
    assert names == {
        "7100002:5": "nightly-report",
        "-7100002": "cache-refresh",
        str(derive_int64("daily-settlement")): "daily-settlement",
        f"7100003:{derive_int32('tenant-export')}": "tenant-export",
        "7100002:6": None,
    }
    # The key filter takes a registered name, and the row carries the name in its Key.
    [only] = advisory_locks(monitor, registry=registry, key="nightly-report")
    assert (only.key, only.key.name, only.name) == (
        Key((7100002, 5)),
        "nightly-report",
        "nightly-report",
    )
    assert advisory_locks(monitor, key=(7100002, 99)) == []
    assert {lock.key for lock in advisory_locks(monitor, pid=holder.info.backend_pid)} == {
        Key((7100002, 5)),
        Key(-7100002),
        Key(derive_int64("daily-settlement")),
        Key((7100003, derive_int32("tenant-export"))),
        Key((7100002, 6)),
    }


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"names": "daily-settlement"}, InvalidArgumentError),
        ({"names": [""]}, InvalidKeyError),
        ({"key": True}, InvalidKeyError),
        ({"key": (1, 2**31)}, InvalidKeyError),
        ({"pid": 0}, InvalidArgumentError),
        ({"pid": "12"}, InvalidArgumentError),
    ],
)
def test_bad_arguments_raise_before_any_sql(
    connect: Connect, kwargs: dict[str, object], error: type[Exception]
) -> None:
    conn = connect()
    conn.close()  # any statement sent would raise psycopg.OperationalError instead
    with pytest.raises(error):
        advisory_locks(conn, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        doctor(conn, older_than=-1)


def test_an_autocommit_off_connection_is_left_idle(connect: Connect) -> None:
    conn = connect(autocommit=False)
    advisory_locks(conn)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    doctor(conn)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # Inside the caller's transaction the monitor joins it and leaves it open.
    conn.execute("SELECT 1")
    advisory_locks(conn)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    conn.rollback()


def test_terminate_backend_releases_what_it_held(connect: Connect, observer: object) -> None:
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(7100004, 1)")
    monitor = connect()
    assert pgsolo.terminate_backend(monitor, holder.info.backend_pid) is True
    assert observer.holders(Key((7100004, 1))) == set()  # type: ignore[attr-defined]
    assert advisory_locks(monitor, pid=holder.info.backend_pid) == []


# -- doctor: each check passes and fails for real ----------------------------------------


@pytest.fixture
def fresh(fresh_db: str) -> Iterator[Callable[..., psycopg.Connection]]:
    """Connections to the test's own database (autocommit), closed afterwards."""
    opened: list[psycopg.Connection] = []

    def _connect(**kwargs: object) -> psycopg.Connection:
        conn = psycopg.connect(fresh_db, autocommit=True, **kwargs)  # type: ignore[arg-type]
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        conn.close()


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
        "lock-table-capacity",
        "application-name",
        "idle-timeouts",
        "lock-timeout",
        "proxy",
        "public-execute",
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


# -- doctor: the proxy check -------------------------------------------------------------


def test_a_direct_connection_passes_the_proxy_check(connect: Connect) -> None:
    check = by_name(doctor(connect()))["proxy"]
    assert check.status == "ok"


def test_a_relay_that_pins_the_session_passes_and_is_named(dsn: str) -> None:
    with FreezingProxy(dsn) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
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
