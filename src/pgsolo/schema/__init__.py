"""pgsolo's own tables, and ``pgsolo migrate``, which creates and upgrades them.

They are opt-in: nothing is created until ``pgsolo migrate`` (or :func:`migrate`) runs.
Each version is a ``.sql`` file in ``migrations/`` named ``NNNN_what.sql``. Migrating is
idempotent and safe from many hosts at once: every version is applied in order, in one
transaction that holds an advisory lock of its own, and recorded in
``pgsolo.schema_migrations``.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from .. import sql
from ..drivers import DriverBase, adapt_sync
from ..keys import Key, from_name
from ..locking.core import LockCore
from ..locking.placement import outside_transaction
from ..locking.plans import Plan, drive

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "MIGRATION_KEY",
    "migrate",
    "schema_version",
]

MIGRATION_KEY: Key = from_name("pgsolo:migrate")
MIGRATION_WAIT_SECONDS = 120


def _load_migrations() -> tuple[tuple[int, str], ...]:
    folder = resources.files(__package__) / "migrations"
    found = sorted(
        (int(entry.name.split("_", 1)[0]), entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    versions = [version for version, _ in found]
    if versions != list(range(1, len(found) + 1)):  # a packaging mistake, not a user's
        raise RuntimeError(f"pgsolo's migrations are not numbered 1..N: {versions}")
    return tuple(found)


MIGRATIONS: tuple[tuple[int, str], ...] = _load_migrations()
"""``(version, SQL)`` for every migration, in order."""
LATEST_VERSION = MIGRATIONS[-1][0]


def _migrate_plan(driver: DriverBase) -> Plan[list[int]]:
    core = LockCore(
        driver,
        MIGRATION_KEY,
        "xact",
        wait_ms=MIGRATION_WAIT_SECONDS * 1000,
        shared=False,
        reentrant=False,
    )
    yield from core.acquire(context=True)
    try:
        current = yield [sql.MIGRATIONS_TABLE, sql.SCHEMA_VERSION]
        applied = [version for version, _ in MIGRATIONS if version > int(str(current))]
        for version, body in MIGRATIONS:
            if version in applied:
                yield [body, sql.record_migration(version)]
    except BaseException:
        yield from core.exit(failed=True)
        raise
    yield from core.exit(failed=False)
    return applied


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Create or upgrade pgsolo's tables; return the versions this call applied."""
    driver = adapt_sync(conn)
    return drive(_migrate_plan(driver), driver)


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The version of pgsolo's tables in this database (0: never migrated)."""
    driver = adapt_sync(conn)
    if driver.fetch_value(outside_transaction(driver, [sql.MIGRATIONS_TABLE_EXISTS])) is not True:
        return 0
    return int(str(driver.fetch_value(outside_transaction(driver, [sql.SCHEMA_VERSION]))))
