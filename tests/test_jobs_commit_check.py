"""The xact job's commit check against work that keeps the lock and its transaction but
resets the session's settings (RESET ALL): still completed, not lost."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from _support import WORK, work_rows
from pgsolo import run_job


def test_reset_all_inside_an_xact_jobs_transaction_is_not_a_lost_lock(
    db: str, connect: Any, observer: Any
) -> None:
    """RESET ALL is allowed inside a transaction and ends neither it nor its xact lock;
    it also resets pgsolo.xact_lock_marker, so the commit check reports a loss and
    rolls back work that ran entirely under the lock (the pg_locks check committed it)."""
    job = f"commit-check-{uuid.uuid4().hex[:12]}"
    conn = connect()

    def work(c: psycopg.Connection[Any]) -> str:
        c.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'written')", (job,))
        c.execute("RESET ALL")  # e.g. a library restoring defaults; the lock is still held
        held = c.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid()"
        ).fetchone()
        assert held == (1,)  # still held, in the same transaction
        return "ok"

    result = run_job(conn, job, work, raise_errors=False)
    assert (result.outcome, result.reason) == ("completed", None), result
    assert work_rows(observer, job) == ["written"]
