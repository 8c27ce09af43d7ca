"""Fixtures: a real PostgreSQL for every test, never a mock.

The servers, the relay, PgBouncer and the replica pairs are ``pgsolo.testing``'s, the way a
user's suite gets them (its plugin's ``pgsolo_*`` fixtures): the server is the one in
``PGSOLO_TEST_DSN`` when it is set, otherwise an embedded PostgreSQL started once per test
session in a temporary directory and deleted afterwards. The short names below (``dsn``,
``bouncer``, ``replicas``...) are the suite's own for them.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from _drivers import aengine, engine  # noqa: F401 - fixtures
from _support import (
    ROLE_PASSWORD,
    SLICE,
    WORK,
    AConnect,
    Connect,
    MakeRole,
    aclosing_all,
    closing_all,
    new_role,
    role_dsn,
)
from pgsolo.keys import Key, decode_pg_lock
from pgsolo.locking import waits
from pgsolo.testing import Bouncer, ReplicaPair, Replicas, bouncer_client

# The plugin by its module name, which is also its entry point's: pytest registers it once,
# whether the installed pgsolo declares the entry point yet or not. pytester runs
# tests/testing's suites of a user.
pytest_plugins = ["pytester", "pgsolo.testing.plugin"]

# Property-based tests (tests/fuzz/): no deadline (a real server answers each example, and a
# shared machine's pauses are no bug), and a connection fixture reused across the examples
# of one test on purpose (each example leaves it as it found it, which is checked).
# HYPOTHESIS_PROFILE=long multiplies every property's example count (_support.fuzz).
settings.register_profile(
    "pgsolo",
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
settings.register_profile("long", parent=settings.get_profile("pgsolo"))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "pgsolo"))


@pytest.fixture(scope="session")
def dsn(pgsolo_dsn: str) -> str:
    return pgsolo_dsn


@pytest.fixture(scope="session")
def bouncer(pgsolo_bouncer: Bouncer) -> Bouncer:
    """A real PgBouncer, transaction pooling, in front of the test server."""
    return pgsolo_bouncer


@pytest.fixture(scope="session")
def session_bouncer(pgsolo_session_bouncer: Bouncer) -> Bouncer:
    """A real PgBouncer, session pooling (a client keeps its server connection)."""
    return pgsolo_session_bouncer


@pytest.fixture
def via_bouncer(bouncer: Bouncer) -> Iterator[Connect]:
    """Open client connections to the transaction-pooling PgBouncer; closed afterwards."""
    with closing_all(functools.partial(bouncer_client, bouncer)) as opener:
        yield opener


@pytest.fixture(scope="session")
def replicas(pgsolo_replicas: Replicas) -> Replicas:
    """A primary and a standby streaming from it, shared by the session: never stop or
    promote them."""
    return pgsolo_replicas


@pytest.fixture
def replica_pair(pgsolo_replica_pair: ReplicaPair) -> ReplicaPair:
    """A private primary and standby for one test, which may stop and promote them."""
    return pgsolo_replica_pair


@pytest.fixture
def connect(dsn: str) -> Iterator[Connect]:
    """Open real connections (autocommit unless asked otherwise); all closed afterwards."""
    with closing_all(functools.partial(psycopg.connect, dsn, autocommit=True)) as opener:
        yield opener


@pytest.fixture
def sync_connect(connect: Connect) -> Connect:
    """``connect`` under a name that a generated sync twin keeps: in a test written once,
    async (under ``_async/``), the other sessions (a holder, an intruder) are sync
    connections, while ``aconnect`` becomes ``connect`` in the twin."""
    return connect


@pytest.fixture
async def aconnect(dsn: str) -> AsyncIterator[AConnect]:
    """``connect`` for async connections."""
    opening = functools.partial(psycopg.AsyncConnection.connect, dsn, autocommit=True)
    async with aclosing_all(opening) as opener:
        yield opener


class Observer:
    """A separate session that looks at ``pg_locks`` the way an operator would."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn = conn

    def advisory(self, *, pid: int | None = None, granted: bool = True) -> set[Key]:
        rows = self.conn.execute(
            "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted = %s"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND (%s::int IS NULL OR pid = %s::int)",
            (granted, pid, pid),
        ).fetchall()
        return {decode_pg_lock(int(c), int(o), int(s)) for c, o, s in rows}

    def holders(self, key: Key) -> set[int]:
        rows = self.conn.execute(
            "SELECT pid, classid::bigint, objid::bigint, objsubid FROM pg_locks"
            " WHERE locktype = 'advisory' AND granted",
        ).fetchall()
        return {pid for pid, c, o, s in rows if decode_pg_lock(int(c), int(o), int(s)) == key}

    def waiters(self, key: Key) -> set[int]:
        rows = self.conn.execute(
            "SELECT pid, classid::bigint, objid::bigint, objsubid FROM pg_locks"
            " WHERE locktype = 'advisory' AND NOT granted",
        ).fetchall()
        return {pid for pid, c, o, s in rows if decode_pg_lock(int(c), int(o), int(s)) == key}


@pytest.fixture
def observer(connect: Connect) -> Observer:
    return Observer(connect())


@pytest.fixture
def primary_observer(replicas: Replicas) -> Iterator[Observer]:
    """An operator's session on the primary of ``replicas``."""
    with replicas.connect_primary() as conn:
        yield Observer(conn)


@pytest.fixture
def standby_observer(replicas: Replicas) -> Iterator[Observer]:
    """An operator's session on the hot standby of ``replicas``: its own ``pg_locks``."""
    with replicas.connect_standby() as conn:
        yield Observer(conn)


_key_counter = iter(range(1, 1_000_000))


@pytest.fixture
def key() -> Key:
    """A fresh pair key per test, so that tests never contend with each other."""
    return Key((7_000_001, next(_key_counter) + os.getpid() % 1000 * 10_000))


@pytest.fixture(scope="session")
def db(dsn: str) -> str:
    """The test database with pgsolo's tables and a table for the jobs' own work."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgsolo.migrate(conn)
        conn.execute(f"CREATE TABLE IF NOT EXISTS {WORK} (job text NOT NULL, note text)")
    return dsn


@pytest.fixture
def fresh_db(dsn: str, observer: Observer) -> Iterator[str]:
    """A brand-new database of its own (no pgsolo tables), dropped afterwards."""
    name = f"pgsolo_test_{uuid.uuid4().hex[:12]}"
    try:
        observer.conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip("the test role cannot create databases")
    try:
        yield make_conninfo(dsn, dbname=name)
    finally:
        observer.conn.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )


@pytest.fixture
def admin(fresh_db: str) -> Iterator[psycopg.Connection]:
    """The test's superuser, in the test's own database (``fresh_db``)."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        yield conn


@pytest.fixture
def make_role(fresh_db: str, admin: psycopg.Connection) -> Iterator[MakeRole]:
    """``make_role(name=None)``: a new LOGIN role with no privilege of its own (password
    ``ROLE_PASSWORD``), and a way to open autocommit connections to the test's database as
    it; the connections are closed and the role dropped (with its grants there) afterwards."""
    made: list[str] = []
    opened: list[psycopg.Connection] = []

    def make(name: str | None = None) -> tuple[str, Callable[[], psycopg.Connection]]:
        role = name or new_role()
        admin.execute(
            pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(role), pgsql.Literal(ROLE_PASSWORD)
            )
        )
        made.append(role)

        def connect() -> psycopg.Connection:
            conn = psycopg.connect(role_dsn(fresh_db, role), autocommit=True)
            opened.append(conn)
            return conn

        return role, connect

    yield make
    for conn in opened:
        conn.close()
    for role in made:
        name = pgsql.Identifier(role)
        admin.execute(pgsql.SQL("DROP OWNED BY {}").format(name))  # its grants here
        admin.execute(pgsql.SQL("DROP ROLE {}").format(name))


@pytest.fixture
def short_slices(monkeypatch: pytest.MonkeyPatch) -> float:
    """Waits cut into slices of :data:`SLICE` seconds, so that a test waits several of them
    in a second or two; the slice, for the test to bound what it sees with."""
    monkeypatch.setattr(waits, "WAIT_SLICE_SECONDS", SLICE)
    return SLICE
