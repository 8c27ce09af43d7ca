"""``awaited_in_place``: an asyncpg round trip awaited in the caller's task, which a
cancellation of the caller does not cut short (it goes on in a task of its own, handed to
``on_cancel``), on a real server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pgsolo.drivers._in_place import awaited_in_place

asyncpg = pytest.importorskip("asyncpg")


@pytest.fixture
async def conn(db: str) -> AsyncIterator[Any]:
    opened = await asyncpg.connect(db)
    try:
        yield opened
    finally:
        await opened.close()


async def _unused(block: asyncio.Future[Any]) -> None:
    raise AssertionError(f"cancelled, with nobody cancelling it: {block}")


async def test_the_round_trip_answers_in_the_callers_task(conn: Any) -> None:
    caller = asyncio.current_task()
    seen: list[asyncio.Task[Any] | None] = []

    async def step() -> Any:
        seen.append(asyncio.current_task())
        return await conn.fetchval("SELECT 40 + 2")

    assert await awaited_in_place(step(), _unused) == 42
    assert seen == [caller]


async def test_the_servers_error_reaches_the_caller(conn: Any) -> None:
    with pytest.raises(asyncpg.DivisionByZeroError):
        await awaited_in_place(conn.fetchval("SELECT 1 / 0"), _unused)
    assert await conn.fetchval("SELECT 1") == 1  # and the connection goes on


async def test_a_cancelled_caller_leaves_the_statement_to_finish_on_its_own(conn: Any) -> None:
    """What a plain ``await`` would not do: asyncpg would cancel its waiter, ask the server
    to cancel the statement and answer the caller before the server did."""
    handed: list[asyncio.Future[Any]] = []
    settled = asyncio.Event()

    async def on_cancel(block: asyncio.Future[Any]) -> None:
        handed.append(block)
        await asyncio.wait({block})
        settled.set()

    caller = asyncio.ensure_future(
        awaited_in_place(conn.fetchval("SELECT pg_sleep(0.3)::text || 'slept'"), on_cancel)
    )
    await asyncio.sleep(0.05)  # the statement is on the server
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert settled.is_set(), "the caller's cancellation went on before the round trip ended"
    [block] = handed
    assert block.result() == "slept"  # not cancelled: the server ran the statement through
    assert await conn.fetchval("SELECT 1") == 1  # nothing of the round trip left in flight


async def test_a_caller_cancelled_at_a_bare_yield_hands_the_rest_over(conn: Any) -> None:
    handed: list[asyncio.Future[Any]] = []

    async def step() -> Any:
        await asyncio.sleep(0)  # a bare yield to the loop, no future to wait on
        return await conn.fetchval("SELECT 'after the yield'")

    async def on_cancel(block: asyncio.Future[Any]) -> None:
        handed.append(block)
        await asyncio.wait({block})

    caller = asyncio.ensure_future(awaited_in_place(step(), on_cancel))
    await asyncio.sleep(0)  # the caller runs up to the step's yield
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [block.result() for block in handed] == ["after the yield"]


async def test_cancelling_the_handed_over_task_reaches_the_statement(conn: Any) -> None:
    """Past its bound, the clean-up cancels the round trip asyncpg's own way: the task it
    was handed cancels asyncpg's waiter, as a task of its own per round trip did."""
    handed: list[asyncio.Future[Any]] = []

    async def on_cancel(block: asyncio.Future[Any]) -> None:
        handed.append(block)
        block.cancel()
        await asyncio.wait({block})

    sleep = conn.fetchval("SELECT pg_sleep(30)")
    caller = asyncio.ensure_future(awaited_in_place(sleep, on_cancel))
    await asyncio.sleep(0.05)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [block.cancelled() for block in handed] == [True]
    # asyncpg asked the server to cancel the sleep: the connection answers again at once
    # the server acknowledged, not after 30 s.
    async with asyncio.timeout(10):
        while True:
            try:
                assert await conn.fetchval("SELECT 1") == 1
                break
            except asyncpg.InterfaceError:  # another operation is in progress: not yet
                await asyncio.sleep(0.05)
