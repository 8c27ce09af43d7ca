"""The database as the judge of mutual exclusion, shared by the contention benchmark
(``benchmarks/scenario_contention.py``) and the chaos suite (``python -m chaos``).

A protected run writes its interval, read from the database's clock
(``clock_timestamp()``), into a table whose exclusion constraint refuses two intervals of
the same key that overlap::

    EXCLUDE USING gist ((int4range(slot, slot, '[]')) WITH =, during WITH &&)

The key is a one-point ``int4range`` so that the constraint needs only the range
operator class built into PostgreSQL (``btree_gist``, the usual way to put a plain
``=`` into a GiST exclusion, is not in every server: pgsolo's earlier embedded one lacked it). An
insert that overlaps fails with SQLSTATE 23P01 (or, when two overlapping inserts wait
on each other, one fails with 40P01 while checking the constraint).
"""

from __future__ import annotations

import psycopg.errors

# What the database raises for an interval that overlaps another of the same key.
OVERLAP_ERRORS = (psycopg.errors.ExclusionViolation, psycopg.errors.DeadlockDetected)


def interval_table(table: str, *, columns: str = "", judged: str = "") -> str:
    """``CREATE TABLE IF NOT EXISTS`` for ``table`` (``slot int``, ``during tstzrange``,
    then ``columns``), refusing overlaps of one slot among the rows where ``judged``
    holds (every row when empty)."""
    extra = f",\n    {columns}" if columns else ""
    where = f" WHERE ({judged})" if judged else ""
    return f"""
CREATE TABLE IF NOT EXISTS {table} (
    slot int NOT NULL,
    during tstzrange NOT NULL{extra},
    EXCLUDE USING gist ((int4range(slot, slot, '[]')) WITH =, during WITH &&){where}
)"""
