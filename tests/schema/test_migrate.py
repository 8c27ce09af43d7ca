"""``migrate()`` and ``schema_version()``: idempotent, and leaving the caller's connection
idle, on a migrated database and on one that never was.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import pgsolo
from _support import IDLE, INTRANS
from pgsolo.schema import LATEST_VERSION, MIGRATIONS, schema_version


def test_migrate_is_idempotent_and_reports_the_schema_version(db: str, observer: Any) -> None:
    assert pgsolo.migrate(observer.conn) == []
    latest = MIGRATIONS[-1][0]
    assert schema_version(observer.conn) == latest == LATEST_VERSION


def test_schema_version_of_an_unmigrated_database_leaves_the_connection_idle(
    fresh_db: str,
) -> None:
    """``schema_version()`` on a database never migrated answers 0 and, like the ledger reads
    on a migrated one, must not leave an autocommit-off connection idle in transaction."""
    with psycopg.connect(fresh_db, autocommit=False) as conn:
        assert schema_version(conn) == 0
        assert conn.info.transaction_status == IDLE


# -- schema_version(): one read, a missing table is version 0 -----------------------------


@pytest.fixture(params=["never-migrated", "migrated"])
def versioned_db(request: pytest.FixtureRequest, fresh_db: str) -> tuple[str, int]:
    """A database of the test's own and the version ``schema_version()`` must find there:
    0 where ``pgsolo migrate`` never ran, ``LATEST_VERSION`` once it has."""
    if request.param == "never-migrated":
        return fresh_db, 0
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        pgsolo.migrate(admin)
    return fresh_db, LATEST_VERSION


def test_schema_version_on_an_autocommit_connection(versioned_db: tuple[str, int]) -> None:
    """``schema_version()`` reads the version in one statement; where pgsolo's tables are
    missing, that statement fails and the answer is 0, not an error."""
    dsn, expected = versioned_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert schema_version(conn) == expected
        assert conn.info.transaction_status == IDLE


def test_schema_version_inside_the_callers_transaction_leaves_it_usable(
    versioned_db: tuple[str, int],
) -> None:
    """Inside a transaction the caller opened, the read runs in a savepoint: a missing
    table (version 0) costs the caller's transaction nothing. Its row is still there,
    the next statement runs, and it commits."""
    dsn, expected = versioned_db
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE callers_work (note text NOT NULL)")
        with conn.transaction():
            conn.execute("INSERT INTO callers_work VALUES ('before')")
            assert schema_version(conn) == expected
            assert conn.info.transaction_status == INTRANS
            assert conn.execute("SELECT note FROM callers_work").fetchall() == [("before",)]
            conn.execute("INSERT INTO callers_work VALUES ('after')")
        assert conn.info.transaction_status == IDLE
        rows = conn.execute("SELECT note FROM callers_work ORDER BY note").fetchall()
        assert rows == [("after",), ("before",)]  # committed, not rolled back


def test_schema_version_opens_no_transaction_on_an_autocommit_off_connection(
    versioned_db: tuple[str, int],
) -> None:
    """On a connection with autocommit off and no transaction open, the read does not
    leave one open behind it (neither the version's nor the failed read's)."""
    dsn, expected = versioned_db
    with psycopg.connect(dsn, autocommit=False) as conn:
        assert conn.info.transaction_status == IDLE
        assert schema_version(conn) == expected
        assert conn.info.transaction_status == IDLE
