"""``pgsolo prune`` and :func:`prune`: what pgsolo's tables would otherwise keep for ever,
deleted by age.

A job run once a minute writes half a million ledger rows a year, and a key per occurrence
(``report@2026-12-01T00:05``) one operation row per run. Each table is pruned oldest first
in batches, one statement and so one short transaction each, found through the indexes of
migration 5: at ten million rows no batch scans the table, and none holds a snapshot (and
VACUUM) back for longer than its own few milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import sql
from .._types import MAX_PERIOD_SECONDS, check_seconds
from ..drivers import DriverBase, adapt_sync
from ..errors import (
    InsufficientPrivilegeError,
    InvalidArgumentError,
    NotMigratedError,
    UnsafeConnectionError,
)
from ..locking import drive, outside_transaction, quietly, require_no_transaction
from ..locking.plans import Plan

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike

__all__ = ["DEFAULT_PRUNE_BATCH", "Pruned", "prune"]

DEFAULT_PRUNE_BATCH = 10_000
MAX_PRUNE_BATCH = 1_000_000


@dataclass(frozen=True, slots=True)
class Pruned:
    """How many rows :func:`prune` deleted (with ``dry_run``: would delete) from each
    table: ``runs`` (the ledger, ``pgsolo.job_runs``), ``periods`` (once-per-period
    records a later period superseded) and ``operations`` (finished ``run_once`` keys,
    only when asked for)."""

    runs: int
    periods: int
    operations: int
    dry_run: bool = False


def prune(
    conn: SyncConnectionLike,
    older_than: float,
    *,
    operations: bool = False,
    batch: int = DEFAULT_PRUNE_BATCH,
    dry_run: bool = False,
) -> Pruned:
    """Delete what pgsolo's tables keep that is older than ``older_than`` seconds, by the
    database's clock, and say how much went.

    - The ledger's attempts (``record=True``, ``pgsolo run --record``) finished before then:
      history only. ``pgsolo history`` and its skip warning read the newest.
    - Once-per-period records completed before then, but only those a later period of the
      same job has superseded: the latest period of each job always stays, so a second
      run in a period that is still going is still skipped.
    - With ``operations=True``, finished operation keys (``run_once``: succeeded or
      failed) finished before then. **A pruned key runs again** if it is asked for again:
      prune only keys that nobody will ask for after ``older_than`` (a key per scheduled
      occurrence, a key per request with a retry window shorter than that). A started
      operation is never pruned.

    Each batch of ``batch`` rows is one statement in its own transaction, so the
    connection must have no transaction open. ``dry_run``: count, delete nothing. Needs
    DELETE on the tables: run it as the role that ran ``pgsolo migrate``.
    """
    older = check_seconds("older_than", older_than, 0, MAX_PERIOD_SECONDS, above_low=True)
    for flag, value in (("operations", operations), ("dry_run", dry_run)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{flag} must be True or False, got {value!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_PRUNE_BATCH:
        raise InvalidArgumentError(
            f"batch must be an int from 1 to {MAX_PRUNE_BATCH}, got {batch!r}"
        )
    driver = adapt_sync(conn)
    require_no_transaction(driver, "prune", "each batch is a transaction of its own")
    if not dry_run and driver.fetch_value(outside_transaction(driver, [sql.SERVER_IN_RECOVERY])):
        raise UnsafeConnectionError(
            f"the server at {driver.server_info().address} is in recovery (a hot standby),"
            " which deletes nothing: run prune against the primary (its own address, or a"
            " multi-host connection string with target_session_attrs=read-write). Nothing"
            " was deleted.",
            reason="server-in-recovery",
        )
    tables = [t for t in sql.PRUNE_TABLES if operations or t != "operations"]
    counts = {
        what: drive(_prune_plan(driver, what, older, batch, dry_run=dry_run), driver)
        for what in tables
    }
    return Pruned(
        runs=counts["runs"],
        periods=counts["periods"],
        operations=counts.get("operations", 0),
        dry_run=dry_run,
    )


def _prune_plan(
    driver: DriverBase,
    what: str,
    older_than: float,
    batch: int,
    *,
    dry_run: bool,
) -> Plan[int]:
    """Batches of ``what`` until one deletes fewer than ``batch`` rows (a dry run: one
    count); the rows they deleted."""
    total = 0
    while True:
        statement = sql.prune_batch(what, older_than, batch, dry_run=dry_run)
        try:
            went = int(str((yield outside_transaction(driver, [statement]))))
        except BaseException as exc:
            if driver.begins_implicitly:  # the batch's own transaction, failed: ended
                yield from quietly(driver, [sql.ROLLBACK])
            refused = _refused(driver, exc)
            if refused is None:
                raise
            raise refused from exc
        total += went
        if dry_run or went < batch:
            return total


def _refused(driver: DriverBase, exc: BaseException) -> Exception | None:
    """pgsolo's error for a prune the server refused, or None."""
    meaning = sql.meaning(driver.sqlstate(exc))
    if meaning is sql.Meaning.NOT_MIGRATED:
        return NotMigratedError("pgsolo's tables are missing here: nothing to prune")
    if meaning is sql.Meaning.NO_PRIVILEGE:
        user = driver.server_info().user
        return InsufficientPrivilegeError(
            f"pgsolo prune deletes from pgsolo's tables, which role {user!r} may not (permission"
            " denied, SQLSTATE 42501): run it as the role that ran pgsolo migrate (their"
            " owner). Nothing more was deleted.",
            needs=("the owner of pgsolo's tables",),
        )
    return None
