"""One Locker shared by many threads or tasks: never two holders of a key at once, a
release never stuck behind a waiter on the same connection, a lost connection cancelling
the tasks that asked for it (``Keep(cancel=True)``), and a forked child refused.

Real threads, tasks and a real ``fork()``; overlap is counted in the holders' own
critical sections, and what is held afterwards is read from ``pg_locks``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import pytest

import pgsolo
from _support import (
    SnapshotWatch,
    aeventually,
    backends_named,
    eventually,
    interrupted,
    terminate,
    unique_name,
)
from pgsolo import Keep, Key, LockLostError

KEYS = [f"locker-hammer-{i}" for i in range(4)]


def test_threads_sharing_a_locker_never_hold_a_key_twice(dsn: str, observer: Any) -> None:
    inside: Counter[str] = Counter()
    overlaps: list[str] = []
    taken: Counter[str] = Counter()
    guard = threading.Lock()

    def worker(locker: pgsolo.Locker, seed: int) -> None:
        chooser = random.Random(seed)
        for _ in range(60):
            name = chooser.choice(KEYS)
            with locker.session_lock(name) as lock:
                if not lock.acquired:
                    continue
                with guard:
                    inside[name] += 1
                    if inside[name] > 1:
                        overlaps.append(name)
                    taken[name] += 1
                time.sleep(0.0005)
                with guard:
                    inside[name] -= 1

    with pgsolo.Locker(dsn, max_connections=2) as locker:
        threads = [threading.Thread(target=worker, args=(locker, i)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert locker.connections <= 2
    assert overlaps == []
    assert sum(taken.values()) > 0
    assert [observer.holders(pgsolo.as_key(name)) for name in KEYS] == [set()] * len(KEYS)


async def test_tasks_sharing_a_locker_never_hold_a_key_twice(dsn: str, observer: Any) -> None:
    inside: Counter[str] = Counter()
    overlaps: list[str] = []
    taken: Counter[str] = Counter()

    async def worker(locker: pgsolo.AsyncLocker, seed: int) -> None:
        chooser = random.Random(seed)
        for _ in range(60):
            name = chooser.choice(KEYS)
            async with locker.session_lock(name, wait=5) as lock:
                inside[name] += 1
                if inside[name] > 1:
                    overlaps.append(name)
                taken[name] += 1
                await asyncio.sleep(0.0005)
                inside[name] -= 1
            assert not lock.acquired

    async with pgsolo.AsyncLocker(dsn, max_connections=2) as locker:
        await asyncio.gather(*(worker(locker, i) for i in range(8)))
        assert locker.connections <= 2
    assert overlaps == []
    assert sum(taken.values()) == 8 * 60  # each waited its turn
    assert [observer.holders(pgsolo.as_key(name)) for name in KEYS] == [set()] * len(KEYS)


def test_a_release_is_never_stuck_behind_a_waiter_on_its_connection(
    dsn: str, sync_connect: Any, observer: Any, key: Key
) -> None:
    holder = sync_connect(autocommit=True)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    outcome: list[object] = []
    with pgsolo.Locker(dsn, max_connections=1) as locker:
        waiter = locker.session_lock(key, wait=30)

        def wait_for_it() -> None:
            try:
                outcome.append(waiter.acquire())
            except BaseException as exc:  # reported to the test below
                outcome.append(exc)

        thread = threading.Thread(target=wait_for_it)
        thread.start()
        try:
            # While the waiter waits, the one connection takes and gives back other keys.
            for i in range(20):
                other = locker.session_lock(f"locker-beside-{i}")
                assert other.acquire()
                other.release()
            assert thread.is_alive()
            assert outcome == []
            assert locker.connections == 1
        finally:
            holder.execute("SELECT pg_advisory_unlock_all()")
            thread.join()
        assert outcome == [True]
        assert observer.holders(key) == {waiter.backend_pid}
        waiter.release()


async def test_a_lost_connection_cancels_each_task_that_asked_for_it(
    dsn: str, observer: Any
) -> None:
    held = asyncio.Event()
    async with pgsolo.AsyncLocker(dsn, max_connections=1) as locker:

        async def work(name: str) -> str:
            try:
                async with locker.session_lock(name, keep=Keep(interval=0.05, cancel=True)):
                    held.set()
                    await asyncio.sleep(30)
            except LockLostError as exc:
                return exc.reason
            return "ran to its end"

        tasks = [asyncio.create_task(work(f"locker-cancel-{i}")) for i in range(3)]
        await aeventually(lambda: held.is_set() and len(observer.advisory()) == 3, "three held")
        (pid,) = {s.driver.backend_pid() for s in locker._sessions}
        terminate(observer, pid)
        reasons = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        assert reasons == ["connection-lost"] * 3
        assert not any(task.cancelled() for task in tasks)


def test_a_forked_child_is_refused_the_parents_connections(dsn: str, observer: Any) -> None:
    with pgsolo.Locker(dsn, max_connections=1) as locker:
        lock = locker.session_lock("locker-fork")
        assert lock.acquire()
        child = os.fork()
        if child == 0:  # the child: must not touch the parent's session
            code = 0
            try:
                # Taking, asking, releasing and leaving the parent's lock are refused (the
                # last three went through, and released the parent's key on its session);
                # closing the Locker leaves the parent's connections alone.
                for touch in (
                    locker.session_lock("locker-fork-child").acquire,
                    lock.is_held,
                    lock.release,
                    lambda: lock.__exit__(None, None, None),
                ):
                    try:
                        touch()
                        code = 3
                    except pgsolo.UsageError as exc:
                        code = code or (0 if "forked child" in str(exc) else 2)
                locker.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's lock, and its connection, are untouched.
        assert lock.is_held()
        assert observer.holders(lock.key) == {lock.backend_pid}
        lock.release()
    eventually(lambda: observer.holders(lock.key) == set(), "nothing held")


def test_shared_holders_through_one_locker_use_separate_sessions(
    dsn: str, observer: Any, key: Key
) -> None:
    with pgsolo.Locker(dsn, max_connections=2) as locker:
        first = locker.session_lock(key, shared=True)
        second = locker.session_lock(key, shared=True)
        third = locker.session_lock(key, shared=True)
        assert first.acquire()
        assert second.acquire()
        assert first.backend_pid != second.backend_pid
        assert not third.acquire()  # both sessions hold it; a third would be re-entrant
        assert observer.holders(key) == {first.backend_pid, second.backend_pid}
        first.release()
        second.release()


def test_closing_a_locker_waits_for_the_job_running_through_it(dsn: str, observer: Any) -> None:
    started, finished = threading.Event(), threading.Event()
    results: list[object] = []
    name = "locker-closing-job"

    def work() -> str:
        started.set()
        time.sleep(0.3)
        finished.set()
        return "finished"

    locker = pgsolo.Locker(dsn, max_connections=1)
    runner = threading.Thread(target=lambda: results.append(pgsolo.run_job(locker, name, work)))
    runner.start()
    assert started.wait(10)
    locker.close()  # waits for the job: its release still has a round trip to make
    assert finished.is_set()
    assert observer.holders(pgsolo.as_key(name)) == set()
    runner.join()
    (result,) = results
    assert isinstance(result, pgsolo.JobCompleted)
    assert result.value == "finished"
    assert observer.holders(pgsolo.as_key(name)) == set()


def test_a_waiter_through_a_locker_holds_no_transaction_or_snapshot(
    dsn: str, sync_connect: Any, key: Key
) -> None:
    """Issue 18's rule through a Locker: its wait is tries, one short statement each, so
    its connection never holds a transaction or a snapshot for the length of the wait,
    and never waits for the lock on the server."""
    holding = 2.0
    holder = sync_connect(autocommit=True)
    holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    with pgsolo.Locker(dsn, max_connections=1) as locker:
        opener = locker.session_lock("locker-snapshot-opener")
        assert opener.acquire()
        pid = opener.backend_pid
        assert pid is not None
        opener.release()
        letting_go = threading.Timer(holding, holder.execute, ("SELECT pg_advisory_unlock_all()",))
        with SnapshotWatch(sync_connect(autocommit=True), pid) as watch:
            letting_go.start()
            try:
                with locker.session_lock(key, wait=30) as lock:
                    assert lock.acquired
                    assert lock.backend_pid == pid
            finally:
                letting_go.join()
    assert not watch.saw_lock_wait
    assert watch.oldest_transaction < holding / 2, f"{watch.oldest_transaction:.2f}s"
    assert watch.oldest_snapshot < holding / 2, f"{watch.oldest_snapshot:.2f}s"


@pytest.mark.parametrize("turns", [1, 3, 6])
async def test_a_close_interrupted_midway_still_ends_every_connection(
    dsn: str, observer: Any, turns: int
) -> None:
    """Guards a close() cut short (a cancelled task, a Ctrl-C) that left the connections
    it had not reached open and holding their locks, out of the Locker's books, so that
    a second close() did nothing."""
    name = unique_name("locker-close-cut")
    locker = pgsolo.AsyncLocker(dsn, max_connections=3, application_name=name)
    locks = [locker.session_lock(f"{name}-{i}") for i in range(9)]
    for lock in locks:
        assert await lock.acquire()
    assert len(backends_named(observer, name)) == 3
    closing = asyncio.ensure_future(locker.close())
    for _ in range(turns):
        await asyncio.sleep(0)
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    await locker.close()  # what a caller does after an interrupted one
    await aeventually(lambda: not backends_named(observer, name), "every backend gone")
    assert observer.advisory() & {lock.key for lock in locks} == set()
    assert locker.connections == 0


def test_a_close_cut_short_by_ctrl_c_is_finished_by_the_next(dsn: str, observer: Any) -> None:
    """The sync side of the guard above: a real SIGINT lands in close() (retried until
    one lands while connections are left to close), and the next close() ends them."""
    cut_short = 0
    for attempt in range(30):
        name = unique_name(f"locker-ctrl-c-{attempt}")
        # Enough connections that closing them takes longer than a signal takes to land.
        locker = pgsolo.Locker(dsn, max_connections=40, application_name=name)
        locks = [locker.session_lock(f"{name}-{i}") for i in range(40)]
        for lock in locks:
            assert lock.acquire()
        assert len(backends_named(observer, name)) == 40
        ended = interrupted(locker.close, lambda locker=locker: locker._closed)
        if isinstance(ended, KeyboardInterrupt) and backends_named(observer, name):
            cut_short += 1
        locker.close()
        eventually(lambda name=name: not backends_named(observer, name), "every backend gone")
        assert observer.advisory() & {lock.key for lock in locks} == set()
        if cut_short >= 3:
            break
    assert cut_short >= 1, "no SIGINT landed while connections were left to close"


FORK_AFTER_AN_ASYNC_LOCKER = r"""
import asyncio, os, sys
import pgsolo

dsn = sys.argv[1]


async def main():
    locker = pgsolo.AsyncLocker(dsn, max_connections=2, application_name="locker-fork-async")
    locks = [locker.session_lock(f"locker-fork-async-{n}") for n in range(3)]
    for lock in locks:
        assert await lock.acquire()
    if os.fork() == 0:
        return "child"  # leaves asyncio.run(), which closes what the loop had suspended
    os.wait()
    for lock in locks:
        assert await lock.is_held(), "the child ended the parent's session"
        await lock.release()
    await locker.close()
    return "parent"


if asyncio.run(main()) == "parent":
    print("held through the child's end")
"""


def test_a_forked_child_leaving_its_event_loop_leaves_the_parents_async_locker_alone(
    dsn: str,
) -> None:
    """Guards an AsyncLocker opened from a DSN whose forked child, never touching it,
    ended the parent's sessions as it left asyncio.run(): the loop closed the suspended
    generator each connection was opened in, which closed the child's copy of the
    connection, and the server ended the parent's session with it."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_AFTER_AN_ASYNC_LOCKER, dsn],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "held through the child's end"
