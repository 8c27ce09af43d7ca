"""Edge cases of async session locks found in review: a cancellation while the block's
exit stops the keeper must not skip the release."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import pgsolo
from pgsolo import Key

AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]


@pytest.mark.parametrize("keep", [False, True], ids=["no-keeper", "keeper"])
async def test_a_second_cancellation_at_the_exit_still_releases(
    aconnect: AConnect, observer: Any, key: Key, keep: bool
) -> None:
    """A task cancelled twice (TaskGroup / timeout / anyio cancel scopes re-cancel): the
    second cancellation lands in __aexit__. Without a keeper the release still completes
    (the round trip is shielded); with one, stopping the keeper is an unshielded await."""
    conn = await aconnect()
    entered = asyncio.Event()

    async def holder() -> None:
        async with pgsolo.session_lock(conn, key, keep=pgsolo.Keep(interval=5) if keep else False):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(holder())
    await entered.wait()
    task.cancel()
    await asyncio.sleep(0)  # the holder runs into __aexit__ and awaits there
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    await asyncio.sleep(0.1)
    assert observer.holders(key) == set(), "the session lock was left held"
    assert pgsolo.held_session_locks(conn) == []
