"""Shared and exclusive modes (``shared=True``): shared holders coexist, an exclusive
holder is alone, for session and xact locks, and under a race of threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import pgsolo
from _support import DEADLINE, Connect, pid_of, run_threads
from pgsolo import (
    Key,
)


def test_shared_holders_coexist_and_exclusive_excludes(
    connect: Connect, observer: Any, key: Key
) -> None:
    n_shared = 6
    conns = [connect() for _ in range(n_shared)]
    all_in = threading.Barrier(n_shared + 1)
    done = threading.Barrier(n_shared + 1)

    def shared_holder(conn: psycopg.Connection) -> Callable[[], None]:
        def run() -> None:
            with pgsolo.session_lock(conn, key, shared=True, wait=DEADLINE) as lock:
                assert lock.acquired
                all_in.wait(DEADLINE)  # every shared holder holds at the same time
                done.wait(DEADLINE)

        return run

    excl = connect()
    outcome: dict[str, object] = {}

    def main_side() -> None:
        all_in.wait(DEADLINE)
        try:
            outcome["holders"] = observer.holders(key)
            outcome["exclusive_try"] = pgsolo.session_lock(excl, key).acquire()
            with pgsolo.xact_lock(excl, key) as lock:
                outcome["exclusive_xact_try"] = lock.acquired
        finally:
            done.wait(DEADLINE)

    errors = run_threads([shared_holder(c) for c in conns] + [main_side], timeout=30)
    assert errors == []
    assert outcome["holders"] == {pid_of(c) for c in conns}
    assert outcome["exclusive_try"] is False
    assert outcome["exclusive_xact_try"] is False
    assert observer.holders(key) == set()

    # A mixed race: shared holders never meet an exclusive one, exclusive ones are alone.
    guard = threading.Lock()
    state = {"shared": 0, "exclusive": 0, "max_exclusive": 0, "excl_entries": 0}
    start = threading.Barrier(n_shared + 2)
    excl_conns = [excl, connect()]

    def shared_racer(conn: psycopg.Connection) -> Callable[[], None]:
        def run() -> None:
            start.wait(DEADLINE)
            for _ in range(10):
                with pgsolo.session_lock(conn, key, shared=True) as lock:
                    if lock.acquired:
                        with guard:
                            state["shared"] += 1
                            assert state["exclusive"] == 0
                        time.sleep(0.001)
                        with guard:
                            state["shared"] -= 1

        return run

    def exclusive_racer(conn: psycopg.Connection) -> Callable[[], None]:
        def run() -> None:
            start.wait(DEADLINE)
            for _ in range(10):
                with pgsolo.xact_lock(conn, key, wait=DEADLINE) as lock:
                    assert lock.acquired
                    with guard:
                        state["exclusive"] += 1
                        state["excl_entries"] += 1
                        state["max_exclusive"] = max(state["max_exclusive"], state["exclusive"])
                        assert state["shared"] == 0
                    time.sleep(0.001)
                    with guard:
                        state["exclusive"] -= 1

        return run

    errors = run_threads(
        [shared_racer(c) for c in conns] + [exclusive_racer(c) for c in excl_conns], timeout=30
    )
    assert errors == []
    assert state["max_exclusive"] == 1
    assert state["excl_entries"] == 20
    assert observer.holders(key) == set()


def test_shared_and_exclusive_session_locks(connect: Connect, observer: Any, key: Key) -> None:
    s1, s2, x = connect(), connect(), connect()
    first = pgsolo.session_lock(s1, key, shared=True)
    second = pgsolo.session_lock(s2, key, shared=True)
    assert first.acquire() is True
    assert second.acquire() is True
    assert observer.holders(key) == {pid_of(s1), pid_of(s2)}
    assert pgsolo.session_lock(x, key).acquire() is False
    with pgsolo.xact_lock(x, key) as lock:
        assert lock.acquired is False
    first.release()
    assert pgsolo.session_lock(x, key).acquire() is False  # one shared holder is enough
    second.release()

    exclusive = pgsolo.session_lock(x, key)
    assert exclusive.acquire() is True
    assert pgsolo.session_lock(s1, key, shared=True).acquire() is False
    with pgsolo.xact_lock(s2, key, shared=True) as lock:
        assert lock.acquired is False
    assert observer.holders(key) == {pid_of(x)}
    exclusive.release()
    assert observer.holders(key) == set()


def test_shared_and_exclusive_xact_locks(connect: Connect, observer: Any, key: Key) -> None:
    s1, s2, x = connect(), connect(), connect()
    with pgsolo.xact_lock(s1, key, shared=True) as a, pgsolo.xact_lock(s2, key, shared=True) as b:
        assert a.acquired
        assert b.acquired
        assert observer.holders(key) == {pid_of(s1), pid_of(s2)}
        with pgsolo.xact_lock(x, key) as lock:
            assert lock.acquired is False
    with pgsolo.xact_lock(x, key) as lock:
        assert lock.acquired
        with pgsolo.xact_lock(s1, key, shared=True) as shared:
            assert shared.acquired is False
    assert observer.holders(key) == set()
