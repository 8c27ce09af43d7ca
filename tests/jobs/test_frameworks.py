"""``run_job`` / ``run_job_async`` on SQLAlchemy's ``Connection`` and ``AsyncConnection``
(psycopg, psycopg2, asyncpg dialects), with a transaction lock and a session lock: at
every ending (completed, the work raised, interrupted, the work committed, the work
committed and went on) the connection comes back as found (SQLAlchemy's books, the
server's transaction status, the driver's autocommit), no advisory lock is left, and the
pool's next user of the same connection gets real transactions (issue 21: the connection
is the user's). With a session lock, the transaction the work's own statements began is
the caller's and stays open for it, as on a bare connection.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import pgsolo
import pgsolo.sqlalchemy
from _drivers import (
    acheck_next_user,
    check_next_user,
    sqlalchemy_fingerprint,
    sqlalchemy_insert,
    sqlalchemy_pid,
    sqlalchemy_raw,
)
from _support import Boom, new_job, work_rows
from pgsolo import Key

ENDINGS = ["completed", "raised", "interrupted", "commits", "commits-and-goes-on"]

# (outcome, reason, rows committed) by lifetime and ending
EXPECTED: dict[tuple[str, str], tuple[str | None, str | None, list[str]]] = {
    ("xact", "completed"): ("completed", None, ["completed"]),
    ("xact", "raised"): ("failed", None, []),
    ("xact", "interrupted"): (None, None, []),
    ("xact", "commits"): ("lost", "work-ended-transaction", ["commits"]),
    ("xact", "commits-and-goes-on"): ("lost", "work-ended-transaction", ["commits-and-goes-on"]),
    ("session", "completed"): ("completed", None, ["completed"]),
    ("session", "raised"): ("failed", None, []),
    ("session", "interrupted"): (None, None, []),
    ("session", "commits"): ("completed", None, ["commits"]),
    ("session", "commits-and-goes-on"): ("completed", None, ["commits-and-goes-on"] * 2),
}


def left_by_work(found: tuple[object, ...], lifetime: str, how: str) -> tuple[object, ...]:
    """What the caller finds after the job: as before it, except that with a session lock
    the transaction the work's last statement began is the caller's, left open for it to
    commit or roll back (as on a bare connection with autocommit off)."""
    if lifetime == "xact" or how == "commits":
        return found
    return (True, "intrans", *found[2:])


def work(job: str, how: str) -> Any:
    def fn(conn: Connection) -> str:
        sqlalchemy_insert(conn, job, how)
        if how == "raised":
            raise Boom
        if how == "interrupted":
            raise KeyboardInterrupt
        if how.startswith("commits"):
            conn.commit()
        if how == "commits-and-goes-on":
            sqlalchemy_insert(conn, job, how)
        return "done"

    return fn


def awork(job: str, how: str) -> Any:
    async def fn(conn: AsyncConnection) -> str:
        await sqlalchemy_insert(conn, job, how)
        if how == "raised":
            raise Boom
        if how == "interrupted":
            raise KeyboardInterrupt
        if how.startswith("commits"):
            await conn.commit()
        if how == "commits-and-goes-on":
            await sqlalchemy_insert(conn, job, how)
        return "done"

    return fn


def held_until_it_ends(
    observer: Any, pid: int, key: Key, lifetime: str, how: str, open_: bool
) -> bool:
    """What the connection holds once the job ended: nothing, except the key of a session
    job whose work left a transaction open (SQLAlchemy autobegan one), which stays held
    until that transaction ends, so that no second run starts before it commits; an
    interruption lets go of everything at once."""
    kept = lifetime == "session" and how != "interrupted" and open_
    return {lock.value for lock in observer.advisory(pid=pid)} == ({key.value} if kept else set())


@pytest.mark.parametrize("how", ENDINGS)
@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_run_job_on_a_sqlalchemy_connection_leaves_it_and_its_pool_as_found(
    engine: Engine, observer: Any, key: Key, lifetime: str, how: str
) -> None:
    """The connection and its pool come back as found at every ending of a job."""
    job = new_job(f"sqlalchemy-{lifetime}-{how}")
    outcome, reason, committed = EXPECTED[lifetime, how]
    with engine.connect() as conn:
        raw, pid, found = sqlalchemy_raw(conn), sqlalchemy_pid(conn), sqlalchemy_fingerprint(conn)
        run = lambda: pgsolo.run_job(  # noqa: E731
            conn, key, work(job, how), lifetime=lifetime, raise_errors=False
        )
        if outcome is None:
            with pytest.raises(KeyboardInterrupt):
                run()
        else:
            result = run()
            assert (result.outcome, result.reason if reason else None) == (outcome, reason)
        assert sqlalchemy_fingerprint(conn) == left_by_work(found, lifetime, how)
        assert held_until_it_ends(observer, pid, key, lifetime, how, conn.in_transaction())
        conn.commit() if outcome == "completed" else conn.rollback()
        assert observer.advisory(pid=pid) == set()
    assert work_rows(observer, job) == committed
    with engine.connect() as conn:
        assert sqlalchemy_raw(conn) is raw
        assert sqlalchemy_fingerprint(conn) == found
        check_next_user(conn, observer, key)


@pytest.mark.parametrize("how", ENDINGS)
@pytest.mark.parametrize("lifetime", ["xact", "session"])
async def test_run_job_async_on_an_async_connection_leaves_it_and_its_pool_as_found(
    aengine: AsyncEngine, observer: Any, key: Key, lifetime: str, how: str
) -> None:
    """As the sync test, for AsyncConnection."""
    job = new_job(f"asqlalchemy-{lifetime}-{how}")
    outcome, reason, committed = EXPECTED[lifetime, how]
    async with aengine.connect() as conn:
        raw = await conn.run_sync(sqlalchemy_raw)
        pid = await conn.run_sync(sqlalchemy_pid)
        found = await conn.run_sync(sqlalchemy_fingerprint)
        run = lambda: pgsolo.run_job_async(  # noqa: E731
            conn, key, awork(job, how), lifetime=lifetime, raise_errors=False
        )
        if outcome is None:
            with pytest.raises(KeyboardInterrupt):
                await run()
        else:
            result = await run()
            assert (result.outcome, result.reason if reason else None) == (outcome, reason)
        assert await conn.run_sync(sqlalchemy_fingerprint) == left_by_work(found, lifetime, how)
        assert held_until_it_ends(observer, pid, key, lifetime, how, conn.in_transaction())
        await (conn.commit() if outcome == "completed" else conn.rollback())
        assert observer.advisory(pid=pid) == set()
    assert work_rows(observer, job) == committed
    async with aengine.connect() as conn:
        assert await conn.run_sync(sqlalchemy_raw) is raw
        assert await conn.run_sync(sqlalchemy_fingerprint) == found
        await acheck_next_user(conn, observer, key)
