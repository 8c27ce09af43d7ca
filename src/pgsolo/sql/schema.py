"""The statements of ``pgsolo migrate`` around the migrations (which are ``.sql`` files
in :mod:`pgsolo.schema`)."""

from __future__ import annotations

__all__ = [
    "MIGRATIONS_TABLE",
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


def record_migration(version: int) -> str:
    return f"INSERT INTO pgsolo.schema_migrations (version) VALUES ({int(version)})"
