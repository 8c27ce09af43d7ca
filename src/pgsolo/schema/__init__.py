"""pgsolo's own tables, and ``pgsolo migrate``, which creates and upgrades them.

They are opt-in: nothing is created until ``pgsolo migrate`` (or :func:`migrate`) runs.
Each version is a ``.sql`` file in ``migrations/`` named ``NNNN_what.sql``. Migrating is
idempotent and safe from many hosts at once: every version is applied in order, in one
transaction that holds an advisory lock of its own, and recorded in
``pgsolo.schema_migrations``.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING

from .. import sql
from ..drivers import DriverBase, TxStatus, adapt_sync
from ..keys import Key, from_name
from ..locking._sync.drive import drive
from ..locking.core import LockCore
from ..locking.placement import outside_transaction
from ..locking.plans import Plan

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "MIGRATION_KEY",
    "migrate",
    "schema_version",
    "version_plan",
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


def migrate(conn: SyncConnectionLike) -> list[int]:
    """Create or upgrade pgsolo's tables; return the versions this call applied."""
    driver = adapt_sync(conn)
    return drive(_migrate_plan(driver), driver)


def version_plan(driver: DriverBase, *, first: Sequence[str] = ()) -> Plan[int]:
    """The version of pgsolo's tables in this database (0: never migrated), as a plan:
    :func:`schema_version` drives it, and so does every job attempt that needs the
    tables (``record``, ``period``; ``pgsolo run --record``/``--once-per``).

    One round trip where pgsolo's tables are there (the case that matters, since every
    such job pays it): the version is read directly, and a missing table, which fails
    the statement when it is parsed, means version 0. Inside the caller's transaction the
    read runs in a savepoint, so that the failure costs the transaction nothing.
    ``first``: statements sent before the read in the same message (a job's check that
    the database can hold its name); their failure is raised once the connection is put
    back as it was."""
    status = driver.transaction_status()
    read = [*first, sql.SCHEMA_VERSION]
    if status is TxStatus.INTRANS:
        read = [sql.SAVEPOINT, *read, sql.SAVEPOINT_RELEASE]
    try:
        version = yield outside_transaction(driver, read)
    except Exception as exc:
        if not driver.is_closed():
            if status is TxStatus.INTRANS:
                yield [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE]
            elif driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
                yield [sql.ROLLBACK]  # the transaction the driver opened for the read
        if sql.meaning(driver.sqlstate(exc)) is not sql.Meaning.NOT_MIGRATED:
            raise
        return 0
    return int(str(version))


def schema_version(conn: SyncConnectionLike) -> int:
    """The version of pgsolo's tables in this database (0: never migrated)."""
    driver = adapt_sync(conn)
    return drive(version_plan(driver), driver)
