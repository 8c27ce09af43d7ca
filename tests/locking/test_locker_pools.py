"""A Locker that borrows its connections from the pool of another driver: psycopg2's
``ThreadedConnectionPool`` (sync), asyncpg's pool (async), and a SQLAlchemy engine's pool
(both). Locks work on them as on a
connection of that driver; ``keep=`` is refused before anything is taken (neither driver
lets the keeper share a connection), and each connection goes back holding nothing. A pool
of the other flavour (sync for an AsyncLocker) is refused as the Locker is made.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import psycopg2.pool
import psycopg_pool
import pytest
import sqlalchemy
from sqlalchemy.ext.asyncio import create_async_engine

import pgsolo
from _support import terminate, unique_name
from pgsolo import Keep


def test_a_psycopg2_pool_lends_the_lockers_connections(dsn: str, observer: Any) -> None:
    pool = psycopg2.pool.ThreadedConnectionPool(1, 2, dsn)
    try:
        name = unique_name("locker-psycopg2")
        with pgsolo.Locker(pool, max_connections=2) as locker:
            locks = [locker.session_lock(f"{name}-{i}") for i in range(10)]
            assert all(lock.acquire() for lock in locks)
            pids = {lock.backend_pid for lock in locks}
            assert len(pids) == 2
            with pytest.raises(pgsolo.UsageError, match="keep"):
                locker.session_lock(f"{name}-kept", keep=Keep()).acquire()
            for lock in locks:
                lock.release()
        for pid in pids:
            assert observer.advisory(pid=pid) == set()
        conn = pool.getconn()  # back in the pool, and usable
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")
                assert cursor.fetchone() == (1,)
        finally:
            pool.putconn(conn)
    finally:
        pool.closeall()


async def test_an_asyncpg_pool_lends_the_lockers_connections(dsn: str, observer: Any) -> None:
    name = unique_name("locker-asyncpg")
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        async with pgsolo.AsyncLocker(pool, max_connections=2) as locker:
            locks = [locker.session_lock(f"{name}-{i}") for i in range(10)]
            for lock in locks:
                assert await lock.acquire()
            pids = {lock.backend_pid for lock in locks}
            assert len(pids) == 2
            with pytest.raises(pgsolo.UsageError, match="keep"):
                await locker.session_lock(f"{name}-kept", keep=Keep()).acquire()
            held = locker.session_lock(f"{name}-held")
            assert await held.acquire()
        # Closed with a lock still held: the pool got the connection back holding nothing.
        for pid in pids:
            assert observer.advisory(pid=pid) == set()
        async with pool.acquire() as conn:
            assert await conn.fetchval("SELECT 1") == 1


def _sqlalchemy_url(dsn: str, driver: str) -> str:
    return "postgresql+" + driver + "://" + dsn.split("://", 1)[1]


def test_a_sqlalchemy_engine_lends_the_lockers_connections(dsn: str, observer: Any) -> None:
    engine = sqlalchemy.create_engine(_sqlalchemy_url(dsn, "psycopg"), pool_size=2)
    try:
        name = unique_name("locker-engine")
        with pgsolo.Locker(engine, max_connections=2) as locker:
            locks = [locker.session_lock(f"{name}-{i}", keep=Keep()) for i in range(6)]
            assert all(lock.acquire() for lock in locks)
            pids = {lock.backend_pid for lock in locks}
            assert len(pids) == 2
            assert engine.pool.checkedout() == 2
            held = locker.session_lock(f"{name}-held")
            assert held.acquire()
        # Closed with a lock still held: the engine's pool has both back, holding nothing.
        assert engine.pool.checkedout() == 0
        for pid in pids:
            assert observer.advisory(pid=pid) == set()
    finally:
        engine.dispose()


async def test_a_sqlalchemy_async_engine_lends_the_lockers_connections(
    dsn: str, observer: Any
) -> None:
    engine = create_async_engine(_sqlalchemy_url(dsn, "psycopg"), pool_size=2)
    try:
        name = unique_name("locker-async-engine")
        async with pgsolo.AsyncLocker(engine, max_connections=2) as locker:
            locks = [locker.session_lock(f"{name}-{i}") for i in range(6)]
            for lock in locks:
                assert await lock.acquire()
            pids = {lock.backend_pid for lock in locks}
            assert len(pids) == 2
            assert engine.pool.checkedout() == 2
        assert engine.pool.checkedout() == 0
        for pid in pids:
            assert observer.advisory(pid=pid) == set()
    finally:
        await engine.dispose()


async def test_a_pool_of_the_other_flavour_is_refused_before_anything_is_borrowed(
    dsn: str,
) -> None:
    """Guards an AsyncLocker over a sync pool (and a Locker over an async one): each lock
    borrowed a connection (blocking the event loop), was refused, and never gave it back,
    until the pool had none left."""
    sync_pool = psycopg_pool.ConnectionPool(dsn, min_size=1, max_size=2, open=False)
    async_pool = psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=2, open=False)
    with pytest.raises(pgsolo.InvalidArgumentError, match="an AsyncLocker needs an async pool"):
        pgsolo.AsyncLocker(sync_pool)  # type: ignore[arg-type]
    with pytest.raises(pgsolo.InvalidArgumentError, match="a Locker needs a sync pool"):
        pgsolo.Locker(async_pool)  # type: ignore[arg-type]


def test_keep_cancel_on_a_sync_locker_names_the_async_one(dsn: str) -> None:
    with pytest.raises(pgsolo.UsageError, match="it needs an AsyncLocker"):
        pgsolo.Locker(dsn).session_lock("k", keep=pgsolo.Keep(cancel=True))


async def test_an_async_engine_connection_its_server_ended_is_thrown_away_not_lent_again(
    dsn: str, observer: Any
) -> None:
    """Guards an AsyncEngine on asyncpg whose pooled connection the server ended: the
    Locker gave it back with close(), whose reset sends nothing on asyncpg, so the pool
    kept it and lent it again, and every later lock was refused before any SQL
    (ConnectionStateError), for good. It is now invalidated, and another borrowed."""
    engine = create_async_engine(_sqlalchemy_url(dsn, "asyncpg"), pool_size=1, max_overflow=0)
    try:
        name = unique_name("locker-engine-dead")
        async with pgsolo.AsyncLocker(engine, max_connections=1, idle_timeout=0.2) as locker:
            first = locker.session_lock(f"{name}-1")
            assert await first.acquire()
            dead = first.backend_pid
            assert dead is not None
            await first.release()
            await locker.close()  # its connection goes back to the engine's pool, alive
            terminate(observer, dead)
        async with pgsolo.AsyncLocker(engine, max_connections=1) as locker:
            for n in range(3):
                lock = locker.session_lock(f"{name}-again-{n}")
                assert await lock.acquire()
                assert lock.backend_pid != dead
                assert observer.holders(lock.key) == {lock.backend_pid}
                await lock.release()
    finally:
        await engine.dispose()
