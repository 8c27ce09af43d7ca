"""Two sessions waiting on two keys in opposite order: PostgreSQL's deadlock detector
fails one wait (SQLSTATE 40P01); pgsolo turns it into LockDeadlockError naming both keys,
and the victim's side is left clean so that the other session goes on."""

from __future__ import annotations

import asyncio
import threading
from contextlib import nullcontext
from typing import Any

import pytest

import pgsolo
from _support import AConnect, Connect, other_key
from pgsolo import Key, LockDeadlockError, LockUnavailableError

BOUND = 30.0


@pytest.mark.parametrize("lifetime", ["session", "xact"])
def test_opposite_order_waits_end_in_a_typed_deadlock_error(
    connect: Connect, observer: Any, key: Key, lifetime: str
) -> None:
    first, second = key, other_key(key)
    outcomes: dict[str, BaseException | str] = {}
    both_hold_one = threading.Barrier(2, timeout=BOUND)

    def worker(name: str, mine: Key, theirs: Key) -> None:
        conn = connect()
        make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
        try:
            with (
                conn.transaction() if lifetime == "xact" else nullcontext(),
                make(conn, mine, wait=BOUND),
            ):
                both_hold_one.wait()
                with make(conn, theirs, wait=BOUND):
                    outcomes[name] = "got both"
        except BaseException as exc:
            outcomes[name] = exc

    threads = [
        threading.Thread(target=worker, args=("a", first, second)),
        threading.Thread(target=worker, args=("b", second, first)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(BOUND + 10)
    assert sorted(str(type(o).__name__) for o in outcomes.values()) == [
        "LockDeadlockError",
        "str",
    ], outcomes
    [error] = [o for o in outcomes.values() if isinstance(o, BaseException)]
    assert isinstance(error, LockDeadlockError)
    assert isinstance(error, LockUnavailableError)
    assert set(error.keys) == {first, second}
    assert first.text in str(error)
    assert second.text in str(error)
    assert "fixed order" in str(error)
    assert observer.holders(first) == set()
    assert observer.holders(second) == set()


async def test_async_deadlock_is_typed_too(aconnect: AConnect, observer: Any, key: Key) -> None:
    first, second = key, other_key(key)
    a, b = await aconnect(), await aconnect()
    lock_a = pgsolo.session_lock(a, first)
    lock_b = pgsolo.session_lock(b, second)
    assert await lock_a.acquire()
    assert await lock_b.acquire()
    waits = [
        asyncio.ensure_future(pgsolo.session_lock(a, second, wait=BOUND).acquire()),
        asyncio.ensure_future(pgsolo.session_lock(b, first, wait=BOUND).acquire()),
    ]
    done, _ = await asyncio.wait(waits, timeout=BOUND, return_when=asyncio.FIRST_EXCEPTION)
    failed = [task for task in done if task.exception() is not None]
    assert len(failed) == 1
    error = failed[0].exception()
    assert isinstance(error, LockDeadlockError)
    assert set(error.keys) == {first, second}
    # The victim lets go of what it holds; the survivor gets its second key.
    victim_lock = lock_a if failed[0] is waits[0] else lock_b
    await victim_lock.release()
    survivor = waits[1] if failed[0] is waits[0] else waits[0]
    assert await asyncio.wait_for(survivor, BOUND) is True
