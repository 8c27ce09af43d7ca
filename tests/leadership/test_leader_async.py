"""``pgsolo.leader_async()``: one leader at a time among concurrent tasks, a lost term
that cancels the leader's task, and connections of the caller (psycopg, asyncpg) given
back as they were found."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import AConnect, aeventually, terminate, unique_name
from pgsolo.keys import leader_key

Observer = Any


async def test_one_leader_at_a_time_among_tasks(db: str, observer: Observer) -> None:
    name = unique_name("leader")
    leading: list[int] = []
    overlaps: list[list[int]] = []
    tokens: list[int | None] = []

    async def candidate(me: int) -> None:
        for _ in range(3):
            async with pgsolo.leader_async(db, name) as term:
                leading.append(me)
                tokens.append(term.token)
                if len(leading) > 1:
                    overlaps.append(list(leading))
                await asyncio.sleep(0.02)
                leading.remove(me)

    await asyncio.wait_for(asyncio.gather(*(candidate(me) for me in range(4))), 60)
    assert not overlaps
    assert len(tokens) == 12
    assert len(set(tokens)) == 12
    assert tokens == sorted(tokens)  # type: ignore[type-var]
    assert observer.holders(leader_key(name)) == set()


async def test_a_lost_term_cancels_the_leader_and_its_block_ends_with_the_loss(
    db: str, observer: Observer
) -> None:
    name = unique_name("leader")
    seen: list[pgsolo.LockLostError] = []
    keep = pgsolo.Keep(interval=0.2, timeout=5, on_lost=seen.append, cancel=True)
    reached_the_end = False
    terms: list[pgsolo.AsyncTerm] = []

    async def lead() -> None:
        nonlocal reached_the_end
        async with pgsolo.leader_async(db, name, keep=keep) as term:
            terms.append(term)
            await asyncio.sleep(60)  # the leader's work: cut short by the loss
            reached_the_end = True

    leader = asyncio.create_task(lead())
    await aeventually(lambda: terms, "the first term")
    term = terms[0]
    assert term.backend_pid is not None
    terminate(observer, term.backend_pid)
    with pytest.raises(pgsolo.LockLostError) as ended:
        await asyncio.wait_for(leader, 20)
    assert ended.value.reason == "connection-lost"
    assert not reached_the_end
    assert term.lost
    assert await term.wait_lost(0)
    assert len(seen) == 1
    async with pgsolo.leader_async(db, name, wait=20) as successor:
        assert successor.token is not None
        assert term.token is not None
        assert successor.token > term.token


async def test_by_default_a_lost_term_cancels_the_leader(db: str, observer: Observer) -> None:
    name = unique_name("leader")
    terms: list[pgsolo.AsyncTerm] = []

    async def lead() -> None:
        async with pgsolo.leader_async(db, name) as term:
            terms.append(term)
            await asyncio.sleep(60)

    leader = asyncio.create_task(lead())
    await aeventually(lambda: terms, "the first term")
    assert terms[0].backend_pid is not None
    terminate(observer, terms[0].backend_pid)
    with pytest.raises(pgsolo.LockLostError):
        await asyncio.wait_for(leader, 20)


async def test_wait_lost_returns_when_the_term_is_lost(db: str, observer: Observer) -> None:
    name = unique_name("leader")
    keep = pgsolo.Keep(interval=0.2, timeout=5)  # no cancel: the leader waits for the loss
    with pytest.raises(pgsolo.LockLostError):  # noqa: PT012 - the block's end raises
        async with pgsolo.leader_async(db, name, keep=keep) as term:
            assert not await term.wait_lost(0.05)
            assert term.backend_pid is not None
            terminate(observer, term.backend_pid)
            assert await asyncio.wait_for(term.wait_lost(), 20)
            assert term.loss is not None


async def test_a_connection_of_the_caller_goes_back_as_it_was_found(
    db: str, aconnect: AConnect, observer: Observer
) -> None:
    conn = await aconnect()
    name = unique_name("leader")
    async with pgsolo.leader_async(conn, name) as term:
        assert observer.holders(leader_key(name)) == {conn.info.backend_pid}
        assert term.backend_pid == conn.info.backend_pid
    assert observer.holders(leader_key(name)) == set()
    assert conn.autocommit
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE


async def test_an_asyncpg_connection_leads_unwatched_or_is_refused(
    db: str, observer: Observer
) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    params = psycopg.conninfo.conninfo_to_dict(db)
    conn = await asyncpg.connect(
        user=params["user"],
        password=params.get("password"),
        host=params.get("host"),
        port=int(params.get("port", 5432)),
        database=params["dbname"],
    )
    name = unique_name("leader")
    try:
        with pytest.raises(pgsolo.UsageError, match="Pass a connection string instead"):
            async with pgsolo.leader_async(conn, name):
                pytest.fail("led unwatched without being asked to")
        assert observer.holders(leader_key(name)) == set()
        async with pgsolo.leader_async(conn, name, keep=False) as term:
            assert observer.holders(leader_key(name)) == {conn.get_server_pid()}
            assert term.token is not None
        assert observer.holders(leader_key(name)) == set()
        assert not conn.is_in_transaction()
    finally:
        await conn.close()


async def test_an_async_call_refuses_a_sync_connection(db: str) -> None:
    with (
        psycopg.connect(db, autocommit=True) as conn,
        pytest.raises(pgsolo.UnsupportedConnectionError, match="leader"),
    ):
        async with pgsolo.leader_async(conn, unique_name("leader")):  # type: ignore[arg-type]
            pytest.fail("led on a sync connection from async code")
