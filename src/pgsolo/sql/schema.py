"""The statements of ``pgsolo migrate`` around the migrations (which are ``.sql`` files
in :mod:`pgsolo.schema`)."""

from __future__ import annotations

__all__ = [
    "MIGRATIONS_TABLE",
    "MIGRATIONS_TABLE_EXISTS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "record_migration",
]


SCHEMA = "pgsolo"


MIGRATIONS_TABLE = """
CREATE SCHEMA IF NOT EXISTS pgsolo;
CREATE TABLE IF NOT EXISTS pgsolo.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM pgsolo.schema_migrations"


# Two statements, not one CASE: a query that names a missing table fails when it is
# parsed, whichever branch would run.
MIGRATIONS_TABLE_EXISTS = "SELECT to_regclass('pgsolo.schema_migrations') IS NOT NULL"


def record_migration(version: int) -> str:
    return f"INSERT INTO pgsolo.schema_migrations (version) VALUES ({int(version)})"
