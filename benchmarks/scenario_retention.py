"""Item 10: retention at scale. ``pgsolo prune`` on a ledger of 10 million attempts (1 million
with ``--quick``), spread over a year, in a database of its own: how long pruning the
older half takes, and what its indexes (migration 5) are worth per batch.

The ratio is the time of one batch (10,000 rows, oldest first: one DELETE and so one
transaction, the longest any snapshot of the prune lives) with the index on
``finished_at`` ÷ without it, on the same table, batches interleaved: without the index
each batch scans and sorts the whole table, so the longer the ledger, the longer every
batch holds back VACUUM. The goal is a batch at least 5 times cheaper (<= 0.2).
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from benchmarks.registry import Context, Goal, Ratio, Row, scenario
from pgsolo import sql

DAYS = 365
OLDER_THAN_S = DAYS / 2 * 86_400.0
BATCH = 10_000
SAMPLES = 6  # batches timed each way, interleaved
GOAL = Goal("<=", 0.2)
FILL = (
    "INSERT INTO pgsolo.job_runs (job, lock_key, outcome, started_at, finished_at,"
    " duration_ms, lock_wait_ms, host, pid)"
    " SELECT 'job-' || mod(n, 50), '1', 'completed', t, t, 12.5, 0.3, 'bench-host', 4242"
    " FROM (SELECT n, now() - make_interval(secs => n * %s) AS t"
    " FROM generate_series(1, %s) n) rows"
)


def _one_batch(conn: psycopg.Connection[Any]) -> tuple[float, int]:
    """One batch of the prune, timed, and how many rows it deleted."""
    started = time.perf_counter()
    went = conn.execute(sql.prune_batch("runs", OLDER_THAN_S, BATCH)).fetchone()
    assert went is not None
    return time.perf_counter() - started, int(went[0])


@scenario("10", "retention: pgsolo prune on a ledger of 10 million attempts")
def retention(ctx: Context) -> list[Row]:
    rows = ctx.size(10_000_000, 1_000_000)
    conninfo = ctx.target.conninfo()
    name = f"pgsolo_bench_prune_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        try:
            with psycopg.connect(make_conninfo(conninfo, dbname=name), autocommit=True) as conn:
                return [_measure(conn, rows)]
        finally:
            admin.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


def _measure(conn: psycopg.Connection[Any], rows: int) -> Row:
    pgsolo.migrate(conn)
    conn.execute(FILL, (DAYS * 86_400.0 / rows, rows))
    conn.execute("VACUUM ANALYZE pgsolo.job_runs")
    with_index: list[float] = []
    without_index: list[float] = []
    gone = 0
    for sample in range(SAMPLES):  # interleaved: the table shrinks alike for both
        for indexed in (True, False) if sample % 2 == 0 else (False, True):
            if not indexed:
                conn.execute("DROP INDEX pgsolo.job_runs_finished_at")
            seconds, went = _one_batch(conn)
            (with_index if indexed else without_index).append(seconds)
            gone += went
            if not indexed:
                conn.execute("CREATE INDEX job_runs_finished_at ON pgsolo.job_runs (finished_at)")
    started = time.perf_counter()
    pruned = pgsolo.prune(conn, OLDER_THAN_S, batch=BATCH)
    total = time.perf_counter() - started
    gone += pruned.runs
    left = conn.execute("SELECT count(*) FROM pgsolo.job_runs").fetchone()
    assert left is not None
    problems = [] if gone + left[0] == rows else [f"{gone} pruned + {left[0]} left != {rows}"]
    return Row(
        scenario="10",
        title=f"prune, time per batch of {BATCH:,}: indexed ÷ not, ledger of {rows:,} rows",
        ratio=Ratio.paired(with_index, without_index),
        goal=GOAL,
        detail=f"{statistics.median(with_index) * 1000:.0f} ms vs"
        f" {statistics.median(without_index) * 1000:.0f} ms per batch; the older half"
        f" ({pruned.runs:,} rows) pruned in {total:.1f} s, {pruned.runs / total:,.0f} rows/s",
        problems=problems,
        data={
            "rows": rows,
            "batch_s_indexed": with_index,
            "batch_s_unindexed": without_index,
            "prune_s": total,
            "pruned": pruned.runs,
        },
    )
