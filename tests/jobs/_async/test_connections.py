"""The connections an async job opens show its name in ``pg_stat_activity``, unless the
caller or the DSN names them. Written once, under ``_async/``: scripts/unasync.py writes
the twin under ``_sync/``. Tests of one flavour only: ``tests/jobs/test_connections.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

from _support import app_name_of, new_job
from pgsolo.jobs import run_job_async


async def test_a_job_shows_its_name_in_pg_stat_activity(db: str, observer: Any) -> None:
    job = new_job("jobs-async-test")

    async def fn(conn: psycopg.AsyncConnection[Any]) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert (await run_job_async(db, job, fn)).value == f"pgsolo:{job}"
    assert (await run_job_async(db, job, fn, lifetime="session")).value == f"pgsolo:{job}"
    named = await run_job_async(db, (7_100_001, 5), fn, name="nightly-settlement")
    assert named.job == "nightly-settlement"
    assert named.value == "pgsolo:nightly-settlement"
    assert (await run_job_async(db, job, fn, application_name="worker-7")).value == "worker-7"
    named_dsn = make_conninfo(db, application_name="from-dsn")
    assert (await run_job_async(named_dsn, job, fn)).value == "from-dsn"
