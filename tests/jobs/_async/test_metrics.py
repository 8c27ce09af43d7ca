"""Prometheus metrics of async jobs: skips counted apart from successes. Written once,
under ``_async/``: scripts/unasync.py writes the twin under ``_sync/``. Tests of one
flavour only: ``tests/jobs/test_metrics.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from _support import Boom, SyncConnect, hold, new_job, sample, unhold
from pgsolo.jobs import run_job_async


async def returns(conn: psycopg.AsyncConnection[Any], value: Any) -> Any:
    return value


async def test_metrics_count_skips_apart_from_successes(
    db: str, sync_connect: SyncConnect, observer: Any
) -> None:
    job = new_job("jobs-async-test")
    attempts = "pgsolo_job_attempts_total"

    for _ in range(2):
        await run_job_async(db, job, returns, None)
    completed_before_skips = sample(attempts, job=job, outcome="completed", reason="")
    holder = hold(sync_connect, job)
    for _ in range(3):
        await run_job_async(db, job, returns, None)
    unhold(holder, job)

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        raise Boom("x")

    await run_job_async(db, job, fn, raise_errors=False)

    assert completed_before_skips == 2
    assert sample(attempts, job=job, outcome="completed", reason="") == 2  # skips add nothing
    assert sample(attempts, job=job, outcome="skipped", reason="busy") == 3
    assert sample(attempts, job=job, outcome="failed", reason="") == 1
    assert sample("pgsolo_job_lock_wait_seconds_count", job=job) == 6
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="completed") == 2
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="failed") == 1
    assert sample("pgsolo_job_duration_seconds_count", job=job, outcome="skipped") == 0
    assert sample("pgsolo_job_duration_seconds_sum", job=job, outcome="completed") >= 0
