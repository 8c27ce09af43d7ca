"""pgsolo's own tables: the ledger of job attempts and the once-per-period records.

They are opt-in: nothing is created until ``pgsolo migrate`` (or :func:`migrate`) runs.
Migrating is idempotent and safe from many hosts at once: every version is applied in
one transaction that holds an advisory lock of its own, and recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from . import sql
from ._plans import Plan, drive, outside_transaction
from .drivers import DriverBase, adapt_sync
from .keys import Key, from_name
from .locks import _LockCore

if TYPE_CHECKING:
    import psycopg

__all__ = ["MIGRATION_KEY", "history", "history_rows", "migrate", "schema_version", "skip_warning"]

MIGRATION_KEY: Key = from_name("pgsolo:migrate")
LATEST_VERSION = sql.MIGRATIONS[-1][0]
MIGRATION_WAIT_SECONDS = 120


def _migrate_plan(driver: DriverBase) -> Plan[list[int]]:
    core = _LockCore(
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
        applied = [version for version, _ in sql.MIGRATIONS if version > int(str(current))]
        for version, body in sql.MIGRATIONS:
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


def history(
    conn: psycopg.Connection[Any], *, job: str | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    """The latest recorded attempts, newest first."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}")
    driver = adapt_sync(conn)
    rows = driver.fetch_value(outside_transaction(driver, [sql.history(job=job, limit=limit)]))
    return history_rows(rows)


def history_rows(value: object) -> list[dict[str, Any]]:
    """The rows of :func:`pgsolo.sql.history`'s answer (UTF-8 JSON, whatever the
    connection's client_encoding)."""
    rows = sql.read_json(value)
    return list(rows) if isinstance(rows, list) else []


SKIP_WARNING_WINDOW = 10


def skip_warning(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Warnings for jobs whose recent attempts are mostly skips because they were busy:
    the work is probably slower than its schedule (the article's advice)."""
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_job.setdefault(str(row["job"]), []).append(row)
    warnings = []
    for job, attempts in by_job.items():
        recent = attempts[:SKIP_WARNING_WINDOW]
        busy = sum(1 for r in recent if r["outcome"] == "skipped" and r.get("reason") == "busy")
        if len(recent) >= 3 and busy * 2 > len(recent):
            warnings.append(
                f"job {job}: {busy} of its last {len(recent)} attempts were skipped because"
                " it was still running; the work may be slower than its schedule"
            )
    return warnings
