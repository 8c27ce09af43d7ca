"""Retention (``pgsolo prune``): the statements that delete what pgsolo's tables keep for
ever otherwise, oldest first, one bounded batch per statement (and so per transaction):
the ledger's attempts, once-per-period records no run can need any more, and, asked for,
finished operations."""

from __future__ import annotations

__all__ = ["PRUNE_TABLES", "SERVER_IN_RECOVERY", "prune_batch"]

# What each table may lose once it is older than the cutoff, and the order it goes in (the
# indexes of migration 5).
_PRUNABLE = {
    # Every attempt is history only.
    "runs": ("pgsolo.job_runs", "id", "t.finished_at < {cutoff}", "t.finished_at"),
    # A period's record is what skips a second run in that period: only one that a later
    # period of the same job has superseded can go (period_done asks for the current one).
    "periods": (
        "pgsolo.job_periods",
        "ctid",
        "t.completed_at < {cutoff} AND EXISTS (SELECT 1 FROM pgsolo.job_periods later"
        " WHERE later.job = t.job AND later.period = t.period"
        " AND later.period_start > t.period_start)",
        "t.completed_at",
    ),
    # A finished operation's row is what makes its key run at most once: once it is gone
    # the key runs again, so these go only when asked for (never a started one).
    "operations": (
        "pgsolo.operations",
        "op_key",
        "t.state <> 'started' AND t.finished_at < {cutoff}",
        "t.finished_at",
    ),
}
PRUNE_TABLES = tuple(_PRUNABLE)

# A standby refuses every delete: asked once, before the first.
SERVER_IN_RECOVERY = "SELECT pg_is_in_recovery()"


def prune_batch(what: str, older_than_s: float, batch: int, *, dry_run: bool = False) -> str:
    """Delete up to ``batch`` rows of ``what`` (one of :data:`PRUNE_TABLES`) older than
    ``older_than_s`` seconds by the server's clock, oldest first, and answer how many went;
    ``dry_run``: count them all, and delete none."""
    table, row_id, condition, age = _PRUNABLE[what]
    cutoff = f"now() - make_interval(secs => {float(older_than_s)!r})"
    where = f"FROM {table} t WHERE {condition.format(cutoff=cutoff)}"
    if dry_run:
        return f"SELECT count(*) {where}"
    chosen = f"SELECT t.{row_id} {where} ORDER BY {age} LIMIT {int(batch)}"
    # The condition again on the DELETE's own rows: a row changed since the batch was
    # chosen (a failed operation taken over, started again) is read again there, and only
    # there (PostgreSQL re-checks a DELETE's own WHERE, not its subquery's).
    again = condition.format(cutoff=cutoff)
    return (
        f"WITH gone AS (DELETE FROM {table} t WHERE t.{row_id} IN ({chosen}) AND {again}"
        " RETURNING 1) SELECT count(*) FROM gone"
    )
