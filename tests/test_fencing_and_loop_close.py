"""Fencing inside a caller's transaction (the token of this acquisition, whatever other
sessions take meanwhile), and an async keeper stopped without being awaited when the event
loop closes right after the block: no pending task, no warning."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from typing import Any

import psycopg
import pytest

from pgsolo import Keep, LockLostError, session_lock, xact_lock


@pytest.mark.parametrize("autocommit", [True, False])
def test_fencing_wait_in_callers_transaction_returns_this_acquisitions_token(
    db: str, key: Any, autocommit: bool
) -> None:
    with psycopg.connect(db, autocommit=autocommit) as conn, psycopg.connect(db) as other:
        other.execute("SELECT nextval('pgsolo.fencing_token_seq')")  # another session's token
        with conn.transaction():
            lock = xact_lock(conn, key, wait=5, fencing=True)
            assert lock.acquire()
            first = lock.token
            session = session_lock(conn, f"{key.text}-session", wait=5, fencing=True)
            assert session.acquire()
            second = session.token
            current = conn.execute("SELECT currval('pgsolo.fencing_token_seq')").fetchone()
            assert current == (second,)
            session.release()
        assert first is not None
        assert second is not None
        assert second > first
        # a busy fencing try answers 0: not acquired, no token
        other.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        with conn.transaction():
            busy = xact_lock(conn, key, fencing=True)
            assert busy.acquire() is False
            assert busy.token is None
            assert not busy.acquired


def test_async_keeper_task_is_finished_when_a_manual_loop_closes(db: str, key: Any) -> None:
    destroyed: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: destroyed.append(context))
        conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
        try:
            async with session_lock(conn, key, keep=Keep(interval=0.01)):
                await asyncio.sleep(0.1)
        finally:
            await conn.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.close()
    gc.collect()
    assert pending == []
    assert destroyed == []


def test_async_keeper_task_finished_when_the_block_closes_its_connection(db: str, key: Any) -> None:
    destroyed: list[dict[str, Any]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: destroyed.append(context))
        conn = await psycopg.AsyncConnection.connect(db, autocommit=True)
        with contextlib.suppress(LockLostError):
            async with session_lock(conn, key, keep=Keep(interval=5)):
                await conn.close()  # release has no I/O left: no await after stop()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    finally:
        loop.close()
    gc.collect()
    assert pending == [], pending
    assert destroyed == []
