"""``run_job_async(locker, ...)``: a job whose session lock is taken through an
:class:`~pgsolo.AsyncLocker`. Its callable gets no connection (the Locker's are shared),
a busy key is skipped or tried until ``wait=`` runs out, only the last try is reported
and recorded, other locks of the Locker go on while the work runs, and ``lifetime="xact"``
is refused before anything connects. Written once, under ``_async/``: scripts/unasync.py
writes the twin under ``_sync/``.
"""

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

import pgsolo
from _support import SyncConnect, hold, key_of, new_job, terminate, unhold
from pgsolo import UsageError
from pgsolo.jobs import run_job_async


async def test_a_job_runs_through_a_locker_without_a_connection_of_its_own(
    db: str, sync_connect: SyncConnect, observer: Any
) -> None:
    job = new_job("jobs-locker")
    seen: list[tuple[Any, ...]] = []
    async with pgsolo.AsyncLocker(db, max_connections=1) as locker:

        async def work(*args: Any) -> str:
            seen.append(args)
            # The Locker's one connection serves its other locks while the work runs.
            beside = locker.session_lock(f"{job}-beside")
            assert await beside.acquire()
            assert observer.holders(key_of(job)) == {beside.backend_pid}
            await beside.release()
            return "done"

        result = await run_job_async(locker, job, work, "a", 2, record=True)
        assert result.outcome == "completed"
        assert result.value == "done"
        assert seen == [("a", 2)]
        assert observer.holders(key_of(job)) == set()

        holder = hold(sync_connect, job)
        try:
            skipped = await run_job_async(locker, job, work, "b", 3, record=True)
            assert skipped.outcome == "skipped"
            assert skipped.reason == "busy"
            assert seen == [("a", 2)]
            timer = threading.Timer(0.3, unhold, (holder, job))
            timer.start()
            waited = await run_job_async(locker, job, work, "c", 4, wait=10, record=True)
            timer.join()
        finally:
            holder.close()
        assert waited.outcome == "completed"
        assert seen == [("a", 2), ("c", 4)]
    rows = pgsolo.history(observer.conn, job=job)
    # One row per call: the tries of the wait are not each an attempt of their own.
    assert [(r["outcome"], r["reason"]) for r in rows] == [
        ("completed", None),
        ("skipped", "busy"),
        ("completed", None),
    ]


async def test_a_transaction_job_through_a_locker_is_refused_before_anything(db: str) -> None:
    async with pgsolo.AsyncLocker(db) as locker:

        async def work() -> None:
            pytest.fail("the work ran")

        with pytest.raises(UsageError, match="session lock"):
            await run_job_async(locker, new_job("jobs-locker"), work, lifetime="xact")
        assert locker.connections == 0


async def test_a_period_already_done_is_skipped_at_once_through_a_locker(db: str) -> None:
    """Guards: a wait through a Locker tries again only while the key is busy; a skip for
    another reason (the period is done) ends the call, however long it might wait."""
    job = new_job("jobs-locker")

    async def work() -> str:
        return "ran"

    async with pgsolo.AsyncLocker(db) as locker:
        first = await run_job_async(locker, job, work, period="day")
        assert first.outcome == "completed"
        again = await run_job_async(locker, job, work, period="day", wait=math.inf)
        assert again.outcome == "skipped"
        assert again.reason == "already-done-this-period"


async def test_a_job_whose_locker_connection_its_server_ended_runs_on_another(
    db: str, observer: Any
) -> None:
    """Guards run_job through a Locker whose idle connection the server ended: the
    attempt's first statement failed on it and run_job raised DatabaseUnavailableError
    (or ConnectionStateError, once found closed), where a Locker's own lock goes to
    another connection; the work had not begun."""
    job = new_job("jobs-locker")
    ran: list[int] = []
    async with pgsolo.AsyncLocker(db, max_connections=2) as locker:
        opening = locker.session_lock(f"{job}-opening")
        assert await opening.acquire()
        dead = opening.backend_pid
        assert dead is not None
        await opening.release()  # its connection stays open, idle
        terminate(observer, dead)

        async def work() -> str:
            ran.append(1)
            return "done"

        result = await run_job_async(locker, job, work)
    assert (result.outcome, result.value) == ("completed", "done")
    assert result.backend_pid != dead
    assert ran == [1]  # once
