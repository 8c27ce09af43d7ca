"""Many threads (sync) or tasks (async), each on its own connection, racing for one key:
never two inside, and with a wait everybody gets a turn.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from _support import (
    DEADLINE,
    AConnect,
    Connect,
    Critical,
    lock_factory,
    lock_for,
    pid_of,
    run_threads,
)
from pgsolo import (
    Key,
)

# -- sync connections ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lifetime", "wait"),
    [("xact", None), ("session", None), ("xact", 20.0), ("session", 20.0)],
    ids=["xact-try", "session-try", "xact-wait", "session-wait"],
)
def test_threads_race_for_one_key(
    connect: Connect, key: Key, lifetime: str, wait: float | None
) -> None:
    n_threads = 16
    rounds = 15 if wait is None else 4
    conns = [connect() for _ in range(n_threads)]
    start = threading.Barrier(n_threads)
    critical = Critical()
    entered = [0] * n_threads
    make = lock_factory(lifetime)

    def worker(i: int) -> Callable[[], None]:
        def run() -> None:
            start.wait(DEADLINE)
            for _ in range(rounds):
                with make(conns[i], key, wait=wait) as lock:
                    if lock.acquired:
                        critical.enter()
                        entered[i] += 1

        return run

    errors = run_threads([worker(i) for i in range(n_threads)], timeout=40)
    assert errors == []
    assert critical.max_inside == 1
    assert critical.entries >= 1
    if wait is not None:
        assert entered == [rounds] * n_threads  # everybody got in, one at a time


# -- async connections ---------------------------------------------------------------------

TASKS = 20


@pytest.mark.parametrize(
    ("lifetime", "wait", "rounds"),
    [
        ("xact", None, 6),
        ("session", None, 6),
        ("xact", 30, 2),
        ("session", 30, 2),
    ],
    ids=["xact-try", "session-try", "xact-wait", "session-wait"],
)
async def test_many_tasks_never_two_inside(
    aconnect: AConnect,
    observer: Any,
    key: Key,
    lifetime: str,
    wait: float | None,
    rounds: int,
) -> None:
    conns = await asyncio.gather(*(aconnect() for _ in range(TASKS)))
    start = asyncio.Barrier(TASKS)
    inside = 0
    most_inside = 0
    entries: Counter[int] = Counter()
    wrong_holders: list[set[int]] = []

    async def worker(i: int, conn: psycopg.AsyncConnection[Any]) -> None:
        nonlocal inside, most_inside
        await start.wait()
        for _ in range(rounds):
            async with lock_for(conn, key, lifetime, wait=wait) as lock:
                if not lock.acquired:
                    continue
                inside += 1
                try:
                    most_inside = max(most_inside, inside)
                    if (holders := observer.holders(key)) != {pid_of(conn)}:
                        wrong_holders.append(holders)
                    await asyncio.sleep(0.002)  # let every other task run meanwhile
                    entries[i] += 1
                finally:
                    inside -= 1

    await asyncio.wait_for(asyncio.gather(*(worker(i, c) for i, c in enumerate(conns))), timeout=60)
    assert most_inside == 1
    assert wrong_holders == []
    assert sum(entries.values()) >= 1
    if wait is not None:
        assert sum(entries.values()) == TASKS * rounds  # every waiter got its turn
    assert observer.holders(key) == set()
    for conn in conns:
        assert conn.info.transaction_status is pq.TransactionStatus.IDLE
        assert pgsolo.held_session_locks(conn) == []
