"""The commit check of a transaction job on every kind of connection (``tests/_drivers.py``):
work that runs ``RESET ALL`` (which wipes pgsolo's marker of the locked transaction and
keeps the lock) commits, and work that commits and goes on in a new transaction is lost
and rolled back. On a bare connection the check is plain SQL in a savepoint, sent with the
COMMIT, and ``pg_locks`` is asked in a second round trip only when the marker is gone; on
Django and SQLAlchemy it is a DO block. Written once, under ``_async/``: the psycopg-only
cases are in ``tests/jobs/test_commit_check.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AKind
from _support import WORK, key_of, new_job, work_rows
from pgsolo.jobs import run_job_async


def _insert(job: str, note: str) -> str:
    return f"INSERT INTO {WORK} (job, note) VALUES ('{job}', '{note}')"


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_reset_all_in_a_transaction_job_commits_its_work(
    kind: AKind, db: str, observer: Any
) -> None:
    """Regression: the marker check became plain SQL, which fails when RESET ALL wiped
    the marker; pgsolo must then ask pg_locks, find the lock held, and commit."""
    job = new_job("commit-check-kinds")
    async with kind.open(db) as conn:

        async def work(_: Any) -> str:
            await conn.execute(_insert(job, "written"))
            await conn.execute("RESET ALL")
            return "ok"

        result = await run_job_async(conn.conn, job, work, raise_errors=False)
        assert (result.outcome, result.reason, result.value) == ("completed", None, "ok"), result
        assert not await conn.in_transaction()
    assert work_rows(observer, job) == ["written"]
    assert observer.holders(key_of(job)) == set()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_work_that_commits_and_goes_on_in_a_new_transaction_is_rolled_back(
    kind: AKind, db: str, observer: Any
) -> None:
    """What ran after the work's own COMMIT ran without the lock: it is rolled back, and
    the run is lost, on every kind (the check of a bare connection finds the marker
    gone, then the lock gone)."""
    job = new_job("commit-check-kinds")
    async with kind.open(db) as conn:

        async def work(_: Any) -> None:
            await conn.execute(_insert(job, "under-the-lock"))
            await conn.execute("COMMIT")
            await conn.execute("BEGIN")
            await conn.execute(_insert(job, "after-the-lock"))

        result = await run_job_async(conn.conn, job, work, raise_errors=False)
        assert (result.outcome, result.reason) == ("lost", "work-ended-transaction"), result
        assert isinstance(result.error, pgsolo.LockLostError)
        assert not await conn.in_transaction()
    assert work_rows(observer, job) == ["under-the-lock"]
    assert observer.holders(key_of(job)) == set()
