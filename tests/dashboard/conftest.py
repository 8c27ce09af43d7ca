"""The dashboard's fixtures: its app against the real test server, and sessions that hold
and wait for advisory locks the way a worker would."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from starlette.testclient import TestClient

from pgsolo.dashboard import create_app
from pgsolo.keys import Key, from_name

TOKEN = "dashboard-test-token"  # noqa: S105 - a test app's own

Holder = Callable[..., tuple[psycopg.Connection, Key]]


@pytest.fixture
def client(db: str) -> Iterator[TestClient]:
    """The read-only dashboard of the test database."""
    with TestClient(create_app(db)) as test_client:
        yield test_client


@pytest.fixture
def guarded(db: str) -> Iterator[TestClient]:
    """The dashboard of the test database, terminate allowed with :data:`TOKEN`."""
    with TestClient(create_app(db, allow_terminate=True, token=TOKEN)) as test_client:
        yield test_client


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def hold(dsn: str) -> Iterator[Holder]:
    """``hold(name, dsn=None)``: a session named as pgsolo names its own
    (``pgsolo:<name>``) that holds the session lock of ``name``; closed afterwards."""
    opened: list[psycopg.Connection] = []

    def take(name: str, where: str | None = None) -> tuple[psycopg.Connection, Key]:
        key = from_name(name)
        conn = psycopg.connect(where or dsn, autocommit=True, application_name=f"pgsolo:{name}")
        opened.append(conn)
        conn.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        return conn, key

    yield take
    for conn in opened:
        conn.close()
