"""``migrate()`` and ``schema_version()``: idempotent, and leaving the caller's connection
idle, on a migrated database and on one that never was.
"""

from __future__ import annotations

from typing import Any

import psycopg

import pgsolo
from pgsolo.schema import LATEST_VERSION, MIGRATIONS, schema_version

IDLE = psycopg.pq.TransactionStatus.IDLE


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
