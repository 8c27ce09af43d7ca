"""Many threads (sync) or tasks (async), each on its own connection, racing for one key:
never two inside, and with a wait everybody gets a turn.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import pq

import pgsolo
from pgsolo import (
    Key,
)

# -- sync connections ----------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]
DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim


def run_threads(targets: list[Callable[[], None]], timeout: float = 30.0) -> list[BaseException]:
    """Run each target in its own thread; join with a bound; return what they raised."""
    errors: list[BaseException] = []
    guard = threading.Lock()

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                with guard:
                    errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, f"{len(stuck)} thread(s) still running after {timeout}s"
    return errors


def lock_factory(lifetime: str) -> Callable[..., pgsolo.Lock]:
    return pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock  # type: ignore[return-value]


class Critical:
    """Counts who is inside; every entry checks it is alone."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.inside = 0
        self.max_inside = 0
        self.entries = 0

    def enter(self) -> None:
        with self.guard:
            self.inside += 1
            self.entries += 1
            self.max_inside = max(self.max_inside, self.inside)
            alone = self.inside == 1
        try:
            assert alone, "two holders inside the critical section at once"
            time.sleep(0.002)
        finally:
            with self.guard:
                self.inside -= 1


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

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]


def pid_of(conn: psycopg.AsyncConnection[Any] | psycopg.Connection[Any]) -> int:
    return conn.info.backend_pid


def lock_for(conn: psycopg.AsyncConnection[Any], key: Key, lifetime: str, **kw: Any) -> Any:
    make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    return make(conn, key, **kw)


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
