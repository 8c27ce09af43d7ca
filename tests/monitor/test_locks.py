"""``advisory_locks()``, ``wait_chains()`` and ``semaphore_uses()``: every kind of key
decoded with its mode and lifetime, wait chains in order (a deadlock cycle included), names
from a registry, a semaphore's slots known from ``semaphores=`` or from its sessions'
``application_name`` (and never from a forged one), bad arguments refused before any SQL,
and the cost of a call with 10,000 locks held.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

import pgsolo
from _support import (
    DEADLINE,
    STATEMENT_BOUND,
    STATEMENT_BOUND_20S,
    Connect,
    eventually,
    in_background,
    unique_name,
)
from pgsolo import (
    AdvisoryLock,
    Key,
    Registry,
    SemaphoreSlot,
    SemaphoreUse,
    advisory_locks,
    doctor,
    semaphore_uses,
    sql,
    wait_chains,
)
from pgsolo.cli.locks import WIDE_COLUMNS, lock_table
from pgsolo.errors import InvalidArgumentError, InvalidKeyError
from pgsolo.keys import derive_int32, derive_int64, semaphore_keys, semaphore_session_name


def mine(conn: psycopg.Connection, *pids: int, key: Key | None = None) -> list[AdvisoryLock]:
    return [lock for lock in advisory_locks(conn, key=key) if lock.pid in pids]


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


def test_a_session_that_holds_back_vacuum_is_shown(connect: Connect) -> None:
    """Guards issue 22: a lock's row says how long its session has held back VACUUM (a
    snapshot or a transaction id in its open transaction: here REPEATABLE READ after its
    first statement), and ``pgsolo locks`` marks it past doctor's threshold; a session
    lock held while idle holds nothing back."""
    reader = connect(application_name="rr-holder")
    reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    reader.execute("SELECT pg_advisory_xact_lock(7300001)")  # and the transaction's snapshot
    idle = connect()
    idle.execute("SELECT pg_advisory_lock(7300002)")
    time.sleep(0.3)
    rows = {
        lock.key: lock for lock in mine(connect(), reader.info.backend_pid, idle.info.backend_pid)
    }
    holding, harmless = rows[Key(7300001)], rows[Key(7300002)]
    assert holding.holds_back_vacuum_seconds is not None
    assert holding.holds_back_vacuum_seconds >= 0.25
    assert holding.as_dict()["holds_back_vacuum_seconds"] == holding.holds_back_vacuum_seconds
    assert harmless.holds_back_vacuum_seconds is None
    assert harmless.as_dict()["holds_back_vacuum_seconds"] is None
    # Past doctor's 60 s (the same row, a minute older), the table marks the session.
    old = replace(holding, holds_back_vacuum_since=holding.observed_at - timedelta(seconds=61))
    narrow = lock_table([old, harmless], wide=False, width=200)
    assert [line[2] for line in narrow[1:]] == [
        f"{reader.info.backend_pid} *",
        str(idle.info.backend_pid),
    ]
    wide = lock_table([old, harmless, holding], wide=True)
    vacuum = WIDE_COLUMNS.index("VACUUM")
    assert [line[vacuum] for line in wide[1:]] == ["1m01s *", "", wide[3][vacuum]]
    assert wide[3][vacuum].endswith("s")
    assert not wide[3][vacuum].endswith("*")
    reader.execute("ROLLBACK")
    idle.execute("SELECT pg_advisory_unlock(7300002)")


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


def test_a_waiter_is_named_as_the_holder_of_its_key_is(connect: Connect, observer: object) -> None:
    """Guards the dashboard's nameless waiting rows: the holder's ``pgsolo:<name>`` proves
    the key's name, and the waiter's own session (plain SQL, no name of pgsolo's) is
    waiting for that same name."""
    name = unique_name("waited-for")
    key = pgsolo.keys.from_name(name)
    holder = connect(application_name=f"pgsolo:{name}")
    waiter = connect(application_name="plain-worker", options=STATEMENT_BOUND)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    thread = in_background(waiter, f"SELECT pg_advisory_lock({key.sql_args})")
    eventually(lambda: observer.waiters(key), "the waiter to wait")  # type: ignore[attr-defined]
    try:
        locks = mine(connect(), holder.info.backend_pid, waiter.info.backend_pid)
        assert [(lock.granted, lock.name, lock.key.name) for lock in locks] == [
            (True, name, name),
            (False, name, name),
        ]
    finally:
        observer.conn.execute(  # type: ignore[attr-defined]
            "SELECT pg_terminate_backend(%s, 5000)", (waiter.info.backend_pid,)
        )
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
        ({"names": None}, InvalidArgumentError),  # a bare TypeError, until a review
        ({"registry": "locks.toml"}, InvalidArgumentError),  # an AttributeError, until then
        ({"names": [""]}, InvalidKeyError),
        ({"key": True}, InvalidKeyError),
        ({"key": (1, 2**31)}, InvalidKeyError),
        ({"pid": 0}, InvalidArgumentError),
        ({"pid": "12"}, InvalidArgumentError),
        ({"semaphores": "exports"}, InvalidArgumentError),
        ({"semaphores": [("exports", 3)]}, InvalidArgumentError),
        ({"semaphores": {"": 3}}, InvalidArgumentError),
        ({"semaphores": {5: 3}}, InvalidArgumentError),
        ({"semaphores": {"x" * 513: 3}}, InvalidArgumentError),
        ({"semaphores": {"exports": 0}}, InvalidArgumentError),
        ({"semaphores": {"exports": 1025}}, InvalidArgumentError),
        ({"semaphores": {"exports": True}}, InvalidArgumentError),
        ({"semaphores": {"exports": "3"}}, InvalidArgumentError),
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


def take_slot(conn: psycopg.Connection, name: str, limit: int) -> pgsolo.Semaphore:
    """A slot of the semaphore ``name`` held by ``conn``'s session, as an application holds
    one (the caller releases it, or closes the connection)."""
    held = pgsolo.semaphore(conn, name, limit=limit)
    assert held.acquire()
    return held


def test_a_semaphore_given_by_its_name_and_limit_is_one_use(connect: Connect) -> None:
    """``semaphores={name: 3}`` marks and names the slot locks of that semaphore, whatever
    their sessions are called, and ``semaphore_uses`` reads them as one semaphore: its
    holders (with their slots) out of 3, and who waits for a slot."""
    name = unique_name("exports")
    a, b, c = (connect(application_name=f"worker-{x}") for x in "abc")
    waiter = connect(application_name="worker-w")
    held = [take_slot(conn, name, 3) for conn in (a, b)]
    pa, pb, pc, pw = (conn.info.backend_pid for conn in (a, b, c, waiter))
    monitor = connect()

    def mine(**kwargs: object) -> list[AdvisoryLock]:
        return [
            lock
            for lock in advisory_locks(monitor, **kwargs)  # type: ignore[arg-type]
            if lock.pid in (pa, pb, pc, pw)
        ]

    locks = mine(semaphores={name: 3})
    slots = {a.info.backend_pid: held[0].slot, b.info.backend_pid: held[1].slot}
    assert {(lock.pid, lock.semaphore) for lock in locks} == {
        (pid, SemaphoreSlot(name, 3, slot)) for pid, slot in slots.items() if slot is not None
    }
    assert {lock.name for lock in locks} == {f"pgsolo:semaphore:{name}:{s}" for s in slots.values()}
    assert all(lock.key.name == lock.name for lock in locks)
    (use,) = semaphore_uses(locks)
    assert (use.name, use.limit, use.held, use.waiting) == (name, 3, 2, ())
    assert use.holders == tuple(sorted(((p, s) for p, s in slots.items()), key=lambda h: h[1]))
    assert use.as_dict() == {
        "name": name,
        "limit": 3,
        "held": 2,
        "holders": [{"pid": pid, "slot": slot} for pid, slot in use.holders],
        "waiting": [],
    }
    # Without it, nothing says whose slots these keys are: two unnamed keys, no semaphore.
    plain = mine()
    assert [(lock.name, lock.semaphore) for lock in plain] == [(None, None), (None, None)]
    assert semaphore_uses(plain) == []

    # Full, and one more waits for whichever slot frees first.
    held.append(take_slot(c, name, 3))
    thread = threading.Thread(target=_wait_for_a_slot, args=(waiter, name, 3))
    thread.start()
    try:

        def waiting() -> list[SemaphoreUse]:
            uses = semaphore_uses(mine(semaphores={name: 3}))
            return uses if uses and uses[0].waiting else []

        (use,) = eventually(waiting, "the waiter in the semaphore's use")
        assert (use.held, use.waiting) == (3, (pw,))
        assert {pid for pid, _slot in use.holders} == {pa, pb, pc}
        table = lock_table(mine(semaphores={name: 3}), wide=False, width=200, semaphores=[use])
        assert len(table) == 2  # the header and the semaphore's one line
    finally:
        held[0].release()
        thread.join(DEADLINE)


def _wait_for_a_slot(conn: psycopg.Connection, name: str, limit: int) -> None:
    with pgsolo.semaphore(conn, name, limit=limit, wait=30) as slot:
        assert slot.acquired


def test_a_semaphore_is_known_from_its_sessions_application_name(connect: Connect) -> None:
    """A session named ``pgsolo:semaphore:<name>/<limit>`` (as pgsolo names those it opens
    for a slot) tells the semaphore and its limit, trusted because the key it holds is a
    slot of that name: then every slot of it is known, whoever holds it."""
    name = unique_name("imports")
    told = connect(application_name=semaphore_session_name(name, 4))
    assert told.execute("SHOW application_name").fetchone() == (f"pgsolo:semaphore:{name}/4",)
    other = connect(application_name="importer")  # an application's own name
    held = [take_slot(told, name, 4), take_slot(other, name, 4)]
    pids = {told.info.backend_pid: held[0].slot, other.info.backend_pid: held[1].slot}
    locks = [lock for lock in advisory_locks(connect()) if lock.pid in pids]
    assert {(lock.pid, lock.semaphore) for lock in locks} == {
        (pid, SemaphoreSlot(name, 4, slot)) for pid, slot in pids.items() if slot is not None
    }
    assert {lock.name for lock in locks} == {f"pgsolo:semaphore:{name}:{s}" for s in pids.values()}
    (use,) = semaphore_uses(locks)
    assert (use.name, use.limit, use.held) == (name, 4, 2)
    # A limit given by the caller is the one shown, whatever a session says.
    given = [lock for lock in advisory_locks(connect(), semaphores={name: 5}) if lock.pid in pids]
    assert {lock.semaphore.limit for lock in given if lock.semaphore} == {5}


def test_a_forged_or_cut_application_name_makes_no_semaphore(connect: Connect) -> None:
    """A session's word is trusted only when the key it holds is a slot of the semaphore it
    names, below the limit it names: never a key of another name, nor a slot past its
    limit; and never a name the server may have cut (63 bytes), whose limit may have lost
    digits."""
    name, other = unique_name("forged"), unique_name("genuine")
    not_its_slot = connect(application_name=semaphore_session_name(name, 3))
    not_its_slot.execute(f"SELECT pg_advisory_lock({semaphore_keys(other, 1)[0].sql_args})")
    past_its_limit = connect(application_name=semaphore_session_name(name, 2))
    past_its_limit.execute(f"SELECT pg_advisory_lock({semaphore_keys(name, 3)[2].sql_args})")
    not_a_limit = connect(application_name=f"pgsolo:semaphore:{name}/03")
    not_a_limit.execute(f"SELECT pg_advisory_lock({semaphore_keys(name, 3)[1].sql_args})")
    # 64 bytes, cut by the server to 63: ".../1" of a semaphore of 10 slots, holding slot 0.
    long_name = "c" * (64 - len("pgsolo:semaphore:") - len("/10"))
    cut = connect(application_name=semaphore_session_name(long_name, 10))
    assert cut.execute("SHOW application_name").fetchone() == (f"pgsolo:semaphore:{long_name}/1",)
    cut.execute(f"SELECT pg_advisory_lock({semaphore_keys(long_name, 1)[0].sql_args})")
    pids = {conn.info.backend_pid for conn in (not_its_slot, past_its_limit, not_a_limit, cut)}
    locks = [lock for lock in advisory_locks(connect()) if lock.pid in pids]
    assert len(locks) == 4
    assert [(lock.name, lock.semaphore) for lock in locks] == [(None, None)] * 4
    assert semaphore_uses(locks) == []


# -- found in review -----------------------------------------------------------------------


def test_a_deadlock_cycle_is_shown_as_a_wait_chain(connect: Connect, observer: object) -> None:
    """wait_chains promises that "a cycle (a deadlock PostgreSQL has not broken yet) ends
    where a pid would repeat", but it only starts chains at waiters nobody waits on: in a
    pure cycle every waiter is waited on, so nothing at all is shown - the one situation
    where the on-call engineer most needs the chain. (deadlock_timeout raised so that the
    server does not break the cycle during the test; needs a superuser.)"""
    first, second = Key((7_200_001, 1)), Key((7_200_001, 2))
    slow = f"{STATEMENT_BOUND_20S} -c deadlock_timeout=60s"
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


def test_every_keeper_beat_fits_the_monitors_cut_of_the_query() -> None:
    """The monitor recognises a keeper's beat by its whole text, key included: the
    longest beat (a pair of the widest int32s, shared) is never cut by the server."""
    widest = Key((-(2**31), -(2**31)))
    for key in (widest, Key(-(2**63))):
        for shared in (False, True):
            assert len(sql.keeper_beat(key, shared=shared)) < sql.MONITOR_QUERY_CHARS
