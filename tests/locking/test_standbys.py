"""Replicas: a hot standby is refused, and a multi-host DSN reaches the primary.

A hot standby grants advisory locks of its own: they are not WAL-logged, so the primary
and every other standby never see them, and two workers on two servers of one cluster
would both "hold" the same key. pgsolo therefore refuses every lock on a server in
recovery (``UnsafeConnectionError``, reason ``server-in-recovery``, ``pgsolo run`` exit
78) before anything is held, and the fix it names, a multi-host DSN with
``target_session_attrs=read-write``, lands on the primary even when it lists the standby
first.

Real servers: the ``replicas`` pair (CI's Debian PostgreSQL with a streaming standby, or a
private pair built for the session). Nothing here stops or promotes them; the failover
tests do that on pairs of their own.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest

import pgsolo
from _support import aclosing_all, closing_all, pgsolo_cli, touching
from pgsolo import Key
from pgsolo.testing import Replicas

Open = Callable[..., psycopg.Connection[Any]]
AOpen = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]

REASON = "server-in-recovery"


def assert_refused(error: BaseException) -> None:
    """The refusal pgsolo owes a lock on a standby: the reason, and the fix named."""
    assert isinstance(error, pgsolo.UnsafeConnectionError), repr(error)
    assert getattr(error, "reason", None) == REASON, repr(error)
    message = str(error)
    assert "target_session_attrs=read-write" in message or "primary" in message, message


@pytest.fixture
def on_standby(replicas: Replicas) -> Iterator[Open]:
    """Open connections to the standby (autocommit unless asked otherwise); closed after."""
    with closing_all(replicas.connect_standby) as opener:
        yield opener


@pytest.fixture
async def on_standby_async(replicas: Replicas) -> AsyncIterator[AOpen]:
    opening = functools.partial(
        psycopg.AsyncConnection.connect, replicas.standby_dsn, autocommit=True, connect_timeout=10
    )
    async with aclosing_all(opening) as opener:
        yield opener


@pytest.fixture(scope="module")
def migrated(replicas: Replicas) -> Replicas:
    """The pair once ``pgsolo migrate`` has run on the primary and the standby has
    replayed it (pgsolo's tables come to a standby only by replication)."""
    with replicas.connect_primary() as conn:
        pgsolo.migrate(conn)
    replicas.wait_replayed()
    return replicas


# -- the premise -------------------------------------------------------------------------


def test_the_standby_is_in_recovery_and_replays_the_primary(replicas: Replicas) -> None:
    """Guards the fixture: one server in recovery, one not, and the standby has what the
    primary writes."""
    replicas.check()
    table = f"pgsolo_replicated_{uuid.uuid4().hex[:8]}"
    with replicas.connect_primary() as primary:
        primary.execute(f"CREATE TABLE {table} (id int)")
    try:
        replicas.wait_replayed()
        with replicas.connect_standby() as standby:
            row = standby.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()
            assert row == (True,)
    finally:
        with replicas.connect_primary() as primary:
            primary.execute(f"DROP TABLE {table}")


def test_an_advisory_lock_on_the_standby_is_invisible_to_the_primary(
    on_standby: Open, primary_observer: Any, standby_observer: Any, key: Key
) -> None:
    """Guards the premise of the refusal: plain SQL on a standby "gets" a key that the
    primary knows nothing about, so a worker on the primary gets it too."""
    holder = on_standby()
    assert holder.execute(f"SELECT pg_try_advisory_lock({key.sql_args})").fetchone() == (True,)
    assert standby_observer.holders(key) == {holder.info.backend_pid}
    assert primary_observer.holders(key) == set()
    row = primary_observer.conn.execute(f"SELECT pg_try_advisory_lock({key.sql_args})").fetchone()
    assert row == (True,)  # two holders of one key, one on each server
    primary_observer.conn.execute(f"SELECT pg_advisory_unlock({key.sql_args})")


# -- every lock on a standby is refused -------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One way of taking a lock: the lifetime, try or wait, exclusive or shared, and for an
    xact lock whether pgsolo opens the transaction (a ``with`` block on an autocommit
    connection) or joins one the caller opened (``.acquire()``)."""

    lifetime: Literal["xact", "session"]
    wait: float | None
    shared: bool
    in_callers_transaction: bool = False

    def __str__(self) -> str:
        parts = [self.lifetime, "wait" if self.wait else "try"]
        parts += ["shared"] if self.shared else []
        parts += ["in-callers-transaction"] if self.in_callers_transaction else []
        return "-".join(parts)

    def lock(self, conn: Any, key: Key) -> Any:
        make = pgsolo.xact_lock if self.lifetime == "xact" else pgsolo.session_lock
        return make(conn, key, wait=self.wait, shared=self.shared)

    def take(self, lock: pgsolo.Lock) -> None:
        if self.in_callers_transaction:
            lock.acquire()
            return
        with lock:
            pytest.fail("the protected block ran on a standby")

    async def atake(self, lock: pgsolo.AsyncLock) -> None:
        if self.in_callers_transaction:
            await lock.acquire()
            return
        async with lock:
            pytest.fail("the protected block ran on a standby")


ATTEMPTS = [
    Attempt(lifetime, wait, shared, in_transaction)
    for lifetime in ("xact", "session")
    for wait in (None, 1.0)
    for shared in (False, True)
    for in_transaction in ((False, True) if lifetime == "xact" else (False,))
]


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=str)
def test_every_lock_on_a_standby_is_refused_and_nothing_is_held(
    on_standby: Open, standby_observer: Any, key: Key, attempt: Attempt
) -> None:
    """A lock on a server in recovery would be the standby's own, unseen by the primary:
    every kind is refused with ``server-in-recovery`` and none is left held, not even
    inside the caller's still-open transaction, whose ``lock_timeout`` a wait's slice
    set and had to put back (sql.xact_wait does it on a standby too)."""
    conn = on_standby(autocommit=not attempt.in_callers_transaction)
    if attempt.in_callers_transaction:
        conn.execute("SET LOCAL lock_timeout = '4321ms'")  # the caller's transaction is open
    lock = attempt.lock(conn, key)
    with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
        attempt.take(lock)
    assert_refused(refused.value)
    assert standby_observer.advisory(pid=conn.info.backend_pid) == set()
    assert standby_observer.holders(key) == set()
    if attempt.in_callers_transaction:
        assert conn.execute("SHOW lock_timeout").fetchone() == ("4321ms",)


@pytest.mark.parametrize("attempt", ATTEMPTS, ids=str)
async def test_every_async_lock_on_a_standby_is_refused_and_nothing_is_held(
    on_standby_async: AOpen, standby_observer: Any, key: Key, attempt: Attempt
) -> None:
    """The async twin: the same refusal on a ``psycopg.AsyncConnection``."""
    conn = await on_standby_async(autocommit=not attempt.in_callers_transaction)
    if attempt.in_callers_transaction:
        await conn.execute("SELECT 1")
    lock = attempt.lock(conn, key)
    with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
        await attempt.atake(lock)
    assert_refused(refused.value)
    assert standby_observer.advisory(pid=conn.info.backend_pid) == set()
    assert standby_observer.holders(key) == set()


# -- jobs and operations on a standby ----------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
@pytest.mark.parametrize("target", ["dsn", "connection"])
def test_run_job_on_a_standby_is_refused_and_never_calls_fn(
    replicas: Replicas,
    on_standby: Open,
    standby_observer: Any,
    key: Key,
    lifetime: Literal["xact", "session"],
    target: str,
) -> None:
    """A job given the standby, as a DSN or as a connection, is refused before its work
    would run: nothing it did there would be protected."""
    calls: list[object] = []
    where = replicas.standby_dsn if target == "dsn" else on_standby()
    with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
        pgsolo.run_job(where, key, calls.append, lifetime=lifetime)
    assert_refused(refused.value)
    assert calls == []
    assert standby_observer.holders(key) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_run_job_async_on_a_standby_is_refused_and_never_calls_fn(
    replicas: Replicas, key: Key, lifetime: Literal["xact", "session"]
) -> None:
    """The async twin of the job's refusal."""
    calls: list[object] = []

    async def work(conn: object) -> None:
        calls.append(conn)

    with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
        await pgsolo.run_job_async(replicas.standby_dsn, key, work, lifetime=lifetime)
    assert_refused(refused.value)
    assert calls == []


def test_run_once_on_a_standby_is_refused_and_never_runs_the_operation(
    migrated: Replicas, on_standby: Open, primary_observer: Any
) -> None:
    """An operation key on a standby is refused like a lock (its tables are there,
    replicated, but nothing may be claimed on a server in recovery); the operation never
    runs and the primary has no trace of it."""
    op_key = f"charge:standby:{uuid.uuid4().hex}"
    ran: list[object] = []

    def operation(ctx: Any) -> str:
        ran.append(ctx)
        return "charged"

    with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
        pgsolo.run_once(on_standby(), op_key, operation)
    assert_refused(refused.value)
    assert ran == []
    row = primary_observer.conn.execute(
        "SELECT count(*) FROM pgsolo.operations WHERE op_key = %s", (op_key,)
    ).fetchone()
    assert row == (0,)


# -- the command line on a standby -------------------------------------------------------


def test_run_on_a_standby_exits_78_without_starting_the_command(
    replicas: Replicas, standby_observer: Any, key: Key, tmp_path: Path
) -> None:
    """``pgsolo run`` on a standby is an unsafe configuration: exit 78, COMMAND never
    starts, and the JSON report says why."""
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        "run", "--dsn", replicas.standby_dsn, "--key", key.text, "--json", "--", *touching(marker)
    )
    assert done.returncode == 78, done.stderr
    assert not marker.exists()
    report = done.stderr_json()
    assert report["outcome"] == "failed"
    assert report["reason"] == REASON
    assert standby_observer.holders(key) == set()


def doctor_checks(dsn: str) -> tuple[int, dict[str, dict[str, Any]]]:
    done = pgsolo_cli("doctor", "--dsn", dsn, "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, {check["name"]: check for check in done.stdout_json()["checks"]}


def test_doctor_fails_the_primary_check_on_a_standby(replicas: Replicas) -> None:
    """``pgsolo doctor`` on a standby says that locks cannot work there: its ``primary``
    check fails, and so does the command (exit 1)."""
    code, checks = doctor_checks(replicas.standby_dsn)
    assert "primary" in checks, sorted(checks)
    assert checks["primary"]["status"] == "fail"
    assert code == 1


def test_prune_on_a_standby_exits_78_and_a_dry_run_counts_there(migrated: Replicas) -> None:
    """Regression: ``pgsolo prune`` on a standby failed at its first delete, exit 1 as a
    database error ("read-only transaction"); it is the same unsafe configuration as
    ``migrate`` there (exit 78). A dry run only counts, which a standby can."""
    done = pgsolo_cli("prune", "--dsn", migrated.standby_dsn, "--older-than", "30d", "--json")
    assert done.returncode == 78, done.stderr
    assert '"server-in-recovery"' in done.stdout
    counted = pgsolo_cli("prune", "--dsn", migrated.standby_dsn, "--older-than", "30d", "--dry-run")
    assert counted.returncode == 0, counted.stderr


def test_migrate_on_a_standby_exits_78_without_a_traceback(replicas: Replicas) -> None:
    """Regression: ``pgsolo migrate`` on a standby raised the refusal as a traceback (exit
    1). It is an unsafe configuration like any other refusal: exit 78, one plain line
    naming the fix."""
    done = pgsolo_cli("migrate", "--dsn", replicas.standby_dsn)
    assert done.returncode == 78, done.stderr
    assert "Traceback" not in done.stderr
    assert "target_session_attrs=read-write" in done.stderr


# -- a multi-host DSN reaches the primary ------------------------------------------------

FORMS = [pytest.param(False, id="key-value"), pytest.param(True, id="url")]


@pytest.mark.parametrize("url", FORMS)
def test_a_read_write_multi_host_dsn_listing_the_standby_first_reaches_the_primary(
    replicas: Replicas, url: bool
) -> None:
    """Guards the fixture and libpq: ``target_session_attrs=read-write`` skips the
    standby listed first; without it the standby is the one reached."""
    with psycopg.connect(replicas.multi_host_dsn(url=url), autocommit=True) as conn:
        assert conn.info.port == replicas.primary_port
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
    with psycopg.connect(replicas.multi_host_dsn(read_write=False, url=url)) as conn:
        assert conn.info.port == replicas.standby_port
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)


@pytest.mark.parametrize("url", FORMS)
def test_a_session_lock_through_the_multi_host_dsn_is_held_on_the_primary(
    replicas: Replicas, primary_observer: Any, key: Key, url: bool
) -> None:
    """A session lock on a connection from the read-write multi-host DSN is taken, and
    the primary's ``pg_locks`` shows it on that connection's backend."""
    with psycopg.connect(replicas.multi_host_dsn(url=url), autocommit=True) as conn:
        with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            assert primary_observer.holders(key) == {conn.info.backend_pid}
        assert primary_observer.holders(key) == set()


@pytest.mark.parametrize("lifetime", ["xact", "session"])
@pytest.mark.parametrize("url", FORMS)
def test_run_job_through_the_multi_host_dsn_runs_on_the_primary(
    replicas: Replicas, key: Key, url: bool, lifetime: Literal["xact", "session"]
) -> None:
    """``run_job`` given the read-write multi-host DSN completes, and its work ran on the
    primary."""

    def where(conn: psycopg.Connection[Any]) -> object:
        return conn.execute("SELECT pg_is_in_recovery(), inet_server_port()").fetchone()

    result = pgsolo.run_job(replicas.multi_host_dsn(url=url), key, where, lifetime=lifetime)
    assert result.outcome == "completed"
    assert result.value == (False, replicas.primary_port)


@pytest.mark.parametrize("url", FORMS)
def test_pgsolo_run_through_the_multi_host_dsn_runs_the_command(
    replicas: Replicas, key: Key, url: bool, tmp_path: Path
) -> None:
    """``pgsolo run --dsn <standby,primary with read-write>`` runs COMMAND (exit 0)."""
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        "run",
        "--dsn",
        replicas.multi_host_dsn(url=url),
        "--key",
        key.text,
        "--json",
        "--",
        *touching(marker),
    )
    assert done.returncode == 0, done.stderr
    assert marker.exists()
    assert done.stderr_json()["outcome"] == "completed"


@pytest.mark.parametrize("via", ["direct", "multi-host-key-value", "multi-host-url"])
def test_doctor_passes_the_primary_check_on_the_primary(replicas: Replicas, via: str) -> None:
    """``pgsolo doctor`` on the primary, directly or through the read-write multi-host DSN,
    passes its ``primary`` check (other checks may warn or fail on a shared server)."""
    dsn = {
        "direct": replicas.primary_dsn,
        "multi-host-key-value": replicas.multi_host_dsn(),
        "multi-host-url": replicas.multi_host_dsn(url=True),
    }[via]
    _, checks = doctor_checks(dsn)
    assert "primary" in checks, sorted(checks)
    assert checks["primary"]["status"] == "ok"


@pytest.mark.parametrize("url", FORMS)
def test_pgsolo_locks_through_the_multi_host_dsn_shows_the_primarys_locks(
    replicas: Replicas, key: Key, url: bool
) -> None:
    """``pgsolo locks`` given the read-write multi-host DSN lists what the primary holds."""
    with replicas.connect_primary() as holder:
        holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        done = pgsolo_cli("locks", "--dsn", replicas.multi_host_dsn(url=url), "--json")
        assert done.returncode == 0, done.stderr
        locks = [lock for lock in done.stdout_json()["locks"] if lock["key"] == key.text]
        assert [(lock["pid"], lock["granted"]) for lock in locks] == [
            (holder.info.backend_pid, True)
        ]


# -- a multi-host DSN that lands on the standby is refused -------------------------------


def test_a_multi_host_dsn_without_read_write_that_lands_on_the_standby_is_refused(
    replicas: Replicas, standby_observer: Any, key: Key
) -> None:
    """Without ``target_session_attrs=read-write`` the standby listed first answers, and
    both a session lock and a job on it are refused like on any standby."""
    dsn = replicas.multi_host_dsn(read_write=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.info.port == replicas.standby_port
        with pytest.raises(pgsolo.UnsafeConnectionError) as refused, pgsolo.session_lock(conn, key):
            pytest.fail("the protected block ran on a standby")
        assert_refused(refused.value)
    calls: list[object] = []
    with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
        pgsolo.run_job(dsn, key, calls.append, lifetime="session")
    assert_refused(refused.value)
    assert calls == []
    assert standby_observer.holders(key) == set()


def test_run_with_a_multi_host_dsn_that_lands_on_the_standby_exits_78(
    replicas: Replicas, key: Key, tmp_path: Path
) -> None:
    """``pgsolo run`` with that DSN exits 78 and COMMAND never starts."""
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        "run",
        "--dsn",
        replicas.multi_host_dsn(read_write=False, url=True),
        "--key",
        key.text,
        "--json",
        "--",
        *touching(marker),
    )
    assert done.returncode == 78, done.stderr
    assert not marker.exists()
    assert done.stderr_json()["reason"] == REASON
