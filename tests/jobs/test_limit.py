"""``run_job(..., limit=N)``: at most N runs of a job at once across real concurrent
sessions, each holding one of the N slots that ``pgsolo.semaphore()`` takes too; busy
only when every slot is held; bad input refused before anything connects."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Literal

import pytest

import pgsolo
from _support import Connect, unique_name
from pgsolo.keys import semaphore_keys

Observer = Any
NOWHERE = "postgresql://u:pw@127.0.0.1:1/db?connect_timeout=1"  # never reached


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_never_more_than_limit_runs_among_threads(
    dsn: str, observer: Observer, lifetime: Literal["xact", "session"]
) -> None:
    name, limit = unique_name("limited"), 2
    guard = threading.Lock()
    running: list[int] = []
    most = [0]
    results: list[pgsolo.JobResult[Any]] = []

    def work(conn: Any, me: int) -> int:
        with guard:
            running.append(me)
            most[0] = max(most[0], len(running))
        time.sleep(0.1)
        with guard:
            running.remove(me)
        return me

    def worker(me: int) -> None:
        results.append(pgsolo.run_job(dsn, name, work, me, limit=limit, lifetime=lifetime, wait=30))

    threads = [threading.Thread(target=worker, args=(me,)) for me in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(r.value for r in results if r.completed) == list(range(6))
    assert 1 < most[0] <= limit  # several at once, never more than the limit
    slots = semaphore_keys(name, limit)
    assert {r.key for r in results} <= set(slots)  # each reports the slot it held
    assert all(observer.holders(key) == set() for key in slots)


def test_busy_only_when_every_slot_is_held_and_shared_with_semaphore(
    dsn: str, connect: Connect, observer: Observer
) -> None:
    name = unique_name("limited")
    slots = semaphore_keys(name, 2)
    first, second = connect(), connect()
    with pgsolo.semaphore(first, name, limit=2) as one:
        seen: list[int] = []

        def work(conn: Any) -> int:
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            seen.append(pid)
            held = observer.holders(slots[1 - (one.slot or 0)])
            assert held == {pid}  # the run holds the slot the semaphore left free
            return int(pid)

        ran = pgsolo.run_job(dsn, name, work, limit=2, lifetime="session")
        assert ran.completed, ran
        assert ran.key == slots[1 - (one.slot or 0)]
        with pgsolo.semaphore(second, name, limit=2) as two:
            assert two.acquired
            skipped = pgsolo.run_job(dsn, name, work, limit=2, wait=0.6)
            assert (skipped.outcome, skipped.reason) == ("skipped", "busy")
        assert len(seen) == 1


def test_a_waiting_run_takes_whichever_slot_frees_first(dsn: str, connect: Connect) -> None:
    name = unique_name("limited")
    holders = [connect() for _ in range(3)]
    semaphores = [pgsolo.semaphore(conn, name, limit=3) for conn in holders]
    for held in semaphores:
        held.acquire()
    freed = semaphores[2].slot  # not the first slot a waiter would wait on, by chance
    started = threading.Event()

    def waiting() -> pgsolo.JobResult[Any]:
        started.set()
        return pgsolo.run_job(dsn, name, lambda conn: "ran", limit=3, wait=30)

    result: list[pgsolo.JobResult[Any]] = []
    thread = threading.Thread(target=lambda: result.append(waiting()))
    thread.start()
    started.wait(10)
    time.sleep(0.5)
    semaphores[2].release()
    thread.join(30)
    for held in semaphores[:2]:
        held.release()
    assert result[0].completed
    assert result[0].key == semaphore_keys(name, 3)[freed or 0]


def test_an_async_job_with_a_limit(dsn: str, observer: Observer) -> None:
    name = unique_name("limited")

    async def work(conn: Any) -> str:
        await asyncio.sleep(0.05)
        return "done"

    async def main() -> list[pgsolo.JobResult[str]]:
        return list(
            await asyncio.gather(
                *(pgsolo.run_job_async(dsn, name, work, limit=2, wait=30) for _ in range(4))
            )
        )

    results = asyncio.run(main())
    assert [r.value for r in results] == ["done"] * 4
    assert all(observer.holders(key) == set() for key in semaphore_keys(name, 2))


@pytest.mark.parametrize(
    ("key", "options", "error", "says"),
    [
        ("x", {"limit": 0}, pgsolo.InvalidArgumentError, "limit must be an int from 1 to 1024"),
        ("x", {"limit": 1025}, pgsolo.InvalidArgumentError, "from 1 to 1024"),
        ("x", {"limit": True}, pgsolo.InvalidArgumentError, "got True"),
        ("x", {"limit": "2"}, pgsolo.InvalidArgumentError, "got '2'"),
        (123, {"limit": 2}, pgsolo.UsageError, "a job whose key is a name"),
        ((1, 2), {"limit": 2}, pgsolo.UsageError, "a job whose key is a name"),
        ("x", {"limit": 2, "period": "day"}, pgsolo.UsageError, "once per period is one run"),
        ("x", {"limit": 2, "namespace": 3}, pgsolo.UsageError, "limit= and namespace="),
        ("", {"limit": 2}, pgsolo.InvalidKeyError, "must not be empty"),
    ],
)
def test_bad_limits_are_refused_before_anything_connects(
    key: Any, options: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        pgsolo.run_job(NOWHERE, key, lambda conn: None, **options)
