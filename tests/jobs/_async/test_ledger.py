"""The ledger (``record=True``) of an async job: one row per attempt, a lost attempt recorded
through a fresh connection, and the ledger before ``migrate``. Written once, under
``_async/``: scripts/unasync.py writes the twin under ``_sync/``. Tests of one flavour
only (warnings, the caller's connection, ledger reads): ``tests/jobs/test_ledger.py``.
"""

from __future__ import annotations

import logging
import os
import socket
from datetime import datetime
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import pgsolo
from _support import (
    IDLE,
    AConnect,
    Boom,
    SyncConnect,
    hold,
    key_of,
    new_job,
    server_now,
    terminate,
    unhold,
)
from pgsolo import LockLostError, UsageError
from pgsolo.jobs import run_job_async
from pgsolo.schema import LATEST_VERSION, MIGRATIONS, schema_version


async def returns(conn: psycopg.AsyncConnection[Any], value: Any) -> Any:
    return value


async def test_the_ledger_records_every_attempt(
    db: str, sync_connect: SyncConnect, observer: Any
) -> None:
    job = new_job("jobs-async-test")
    before = server_now(observer)

    completed = await run_job_async(db, job, returns, "ok", record=True)
    holder = hold(sync_connect, job)
    skipped = await run_job_async(db, job, returns, "ok", record=True)
    unhold(holder, job)

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        raise Boom("disk on fire")

    with pytest.raises(Boom):
        await run_job_async(db, job, fn, record=True)  # recorded before it is re-raised
    after = server_now(observer)

    rows = pgsolo.history(observer.conn, job=job)
    assert [r["outcome"] for r in rows] == ["failed", "skipped", "completed"]  # newest first
    assert [r["reason"] for r in rows] == [None, "busy", None]
    assert rows[0]["error"] == "Boom: disk on fire"
    assert rows[1]["error"] is None
    assert rows[2]["error"] is None
    assert rows[1]["backend_pid"] == skipped.backend_pid
    assert rows[2]["backend_pid"] == completed.backend_pid
    for row in rows:
        assert row["job"] == job
        assert row["lock_key"] == key_of(job).text
        started = datetime.fromisoformat(row["started_at"])
        finished = datetime.fromisoformat(row["finished_at"])
        assert before <= started <= finished <= after  # the database's clock
        assert row["started_at"] <= row["finished_at"]  # same zone: ISO text orders by time
        assert row["duration_ms"] >= 0
        assert row["lock_wait_ms"] >= 0
        assert row["host"] == socket.gethostname()
        assert row["pid"] == os.getpid()
        assert isinstance(row["backend_pid"], int)
        assert row["application_name"] == f"pgsolo:{job}"
        assert row["exit_code"] is None
    assert pgsolo.history(observer.conn, job=job, limit=1) == rows[:1]


async def test_a_lost_attempt_is_recorded_through_a_fresh_connection(
    db: str, observer: Any
) -> None:
    job = new_job("jobs-async-test")
    pids: list[int] = []

    async def fn(conn: psycopg.AsyncConnection[Any]) -> None:
        pids.append(conn.info.backend_pid)
        terminate(observer, conn.info.backend_pid)

    with pytest.raises(LockLostError):
        await run_job_async(db, job, fn, lifetime="session", record=True)

    rows = pgsolo.history(observer.conn, job=job)
    assert len(rows) == 1
    assert rows[0]["outcome"] == "lost"
    assert rows[0]["backend_pid"] == pids[0]  # the attempt's backend, not the recorder's
    assert rows[0]["application_name"] == f"pgsolo:{job}"
    assert "LockLostError" in rows[0]["error"]

    # Without raise_errors, the same kind of attempt comes back as "lost", recorded alike.
    other = new_job("jobs-async-test")
    result = await run_job_async(db, other, fn, lifetime="session", record=True, raise_errors=False)
    assert result.outcome == "lost"
    rows = pgsolo.history(observer.conn, job=other)
    assert [(r["outcome"], r["backend_pid"]) for r in rows] == [("lost", pids[1])]
    assert rows[0]["application_name"] == f"pgsolo:{other}"


class _TerminateAtOutcome(logging.Handler):
    """Terminates the attempt's backend as its outcome is logged: after the work, before
    its ledger row is written."""

    def __init__(self, observer: Any) -> None:
        super().__init__()
        self.observer = observer
        self.killed: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "pgsolo", None) or {}
        if fields.get("outcome") and not self.killed:
            self.killed.append(int(fields["backend_pid"]))
            terminate(self.observer, self.killed[0])


@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_a_connection_that_dies_before_the_row_is_written_is_replaced(
    db: str, observer: Any, caplog: pytest.LogCaptureFixture, lifetime: str
) -> None:
    """Before: the ledger's INSERT failed with the driver's own error (AdminShutdown),
    which run_job raised, so a completed attempt was neither returned nor recorded."""
    job = new_job("jobs-async-test")
    caplog.set_level(logging.INFO, logger="pgsolo")
    killer = _TerminateAtOutcome(observer)
    logging.getLogger("pgsolo").addHandler(killer)
    try:
        result = await run_job_async(db, job, returns, "done", lifetime=lifetime, record=True)
    finally:
        logging.getLogger("pgsolo").removeHandler(killer)

    assert killer.killed == [result.backend_pid]
    assert (result.outcome, result.value) == ("completed", "done")
    rows = pgsolo.history(observer.conn, job=job)
    assert [(r["outcome"], r["backend_pid"]) for r in rows] == [("completed", killer.killed[0])]


async def test_record_or_period_before_migrate_is_a_usage_error_before_the_work(
    fresh_db: str, aconnect: AConnect
) -> None:
    job = new_job("jobs-async-test")
    calls: list[int] = []

    async def fn(c: psycopg.AsyncConnection[Any]) -> None:
        calls.append(1)

    conn = await aconnect(dbname=conninfo_to_dict(fresh_db)["dbname"])
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        assert schema_version(admin) == 0
        # Without record/period, pgsolo needs no tables at all.
        assert (await run_job_async(conn, job, fn)).outcome == "completed"
        calls.clear()

        for options in ({"record": True}, {"period": "day"}):
            with pytest.raises(UsageError, match="pgsolo migrate"):
                await run_job_async(conn, job, fn, **options)
            assert calls == []  # the work did not run: a retry will not run it twice
            assert conn.info.transaction_status == IDLE
            with pytest.raises(UsageError, match="pgsolo migrate"):
                await run_job_async(fresh_db, job, fn, **options)
            assert calls == []
        with pytest.raises(UsageError, match="pgsolo migrate"):
            await run_job_async(fresh_db, job, fn, record=True, lifetime="session")
        assert calls == []

        applied = pgsolo.migrate(admin)
        assert applied == [version for version, _ in MIGRATIONS]
        assert pgsolo.migrate(admin) == []
        assert schema_version(admin) == LATEST_VERSION
        result = await run_job_async(fresh_db, job, fn, record=True, period="day")
        assert result.outcome == "completed"
        assert calls == [1]
        assert [r["outcome"] for r in pgsolo.history(admin, job=job)] == ["completed"]
