"""The connection is the user's: every public call that takes a connection gives it back
exactly as it found it, on every kind of connection (``tests/_drivers.py``), at every
ending.

"As found" is a law the suite checks, not a list of fixes. Before a call the test takes a
fingerprint of the connection (``Handle.fingerprint``: its library's books, such as the
driver's autocommit and the transaction status; its framework's, such as SQLAlchemy's
``in_transaction()`` or Django's ``in_atomic_block``, ``needs_rollback`` and ``on_commit``
callbacks; and the session's own settings, from ``pg_settings``), and after the call it
must be the same. Then the connection goes back to its pool, or through the end of a
request, and out again (``Handle.next_user``): the next user must find it as a fresh one
and it must behave as one (its rollback undoes, its transaction lock is held at the
server: once a pooled connection came back in autocommit and both failed). And no
advisory lock is left on the backend, granted or awaited.

The endings: completed, the work raised, busy (another session holds the key), timed out,
interrupted (a cancelled task; in the sync twin a real SIGINT, as Ctrl-C sends), and lost
(the backend terminated under the work: the connection is dead, so only the next user of a
pool is checked, and pgsolo's own statements must fail with pgsolo's errors). A call that
refuses a connection up front is an ending too, and leaves it as found.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AHandle, AKind
from _support import WORK, Boom, Connect, ainterrupted, terminate, work_rows

ENDINGS = ["completed", "raised", "busy", "timed-out", "interrupted", "lost"]

# The wait each ending gives a call: none (try once), a short one that runs out, or one
# long enough to be interrupted (psycopg2 sees a signal only when its wait returns).
WAITS: dict[str, float | None] = {"timed-out": 0.2, "interrupted": 2.0}

Work = Callable[[], Awaitable[None]]


async def session_lock(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    async with pgsolo.session_lock(handle.conn, name, wait=wait) as lock:
        if lock.acquired:
            await work()


async def xact_lock(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    async with pgsolo.xact_lock(handle.conn, name, wait=wait) as lock:
        if lock.acquired:
            await work()


async def run_job(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    async def job(conn: object) -> None:
        await work()

    await pgsolo.run_job_async(handle.conn, name, job, wait=wait)


async def run_job_session(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    async def job(conn: object) -> None:
        await work()

    await pgsolo.run_job_async(handle.conn, name, job, wait=wait, lifetime="session")


async def run_once(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    async def operation(ctx: object) -> None:
        await work()

    await pgsolo.run_once_async(handle.conn, name, operation, wait=wait)


async def leader(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    # A candidate always waits: a "busy" ending is one that waits a moment. Unwatched, so
    # that every kind leads (a keeper cannot share asyncpg's or pg8000's connection).
    bounded = 0.05 if wait is None else wait
    async with pgsolo.leader_async(handle.conn, name, wait=bounded, keep=False):
        await work()


async def semaphore(handle: AHandle, name: str, wait: float | None, work: Work) -> None:
    async with pgsolo.semaphore(handle.conn, name, limit=1, wait=wait) as slot:
        if slot.acquired:
            await work()


CALLS: dict[str, Callable[[AHandle, str, float | None, Work], Awaitable[None]]] = {
    "session_lock": session_lock,
    "leader": leader,
    "semaphore": semaphore,
    "xact_lock": xact_lock,
    "run_job": run_job,
    "run_job-session": run_job_session,
    "run_once": run_once,
}
# Calls that run the work in a transaction of pgsolo's: it commits the work, or rolls it
# back when the work raises. Under a session lock the work's transactions are its own.
OWNS_ITS_TRANSACTION = {"xact_lock", "run_job", "run_once"}


def held_key(call: str, name: str) -> str:
    """The name whose lock the call takes (an operation's is derived: DESIGN §2)."""
    if call == "semaphore":
        return f"pgsolo:semaphore:{name}:0"  # its one slot
    prefixes = {"run_once": "pgsolo:once:", "leader": "pgsolo:leader:"}
    return prefixes.get(call, "") + name


# The columns of docs/connections.md's table "What each call leaves on your connection", by
# the calls of this module they describe.
DOCUMENTED_COLUMNS = {
    "`session_lock`, `leader`, `semaphore`": ["session_lock", "leader", "semaphore"],
    "`with xact_lock` outside a transaction": ["xact_lock"],
    "`run_job`": ["run_job"],
    '`run_job(lifetime="session")`': ["run_job-session"],
    "`run_once`": ["run_once"],
}


def documented_refusals() -> dict[tuple[str, str], bool]:
    """Whether docs/connections.md says each call is refused on each kind: the table is
    the contract, and the law below holds the code to it."""
    page = Path(__file__).parents[3] / "docs" / "connections.md"
    section = page.read_text(encoding="utf-8").split("### What each call leaves on your")[1]
    header, _, *rows = [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in section.split("\n\n")[2].splitlines()
    ]
    refusals = {}
    for row in rows:
        for kind in re.findall(r"`([a-z0-9-]+)`", row[0]):  # the kinds' names
            for column, cell in zip(header[1:], row[1:], strict=True):
                for call in DOCUMENTED_COLUMNS[column]:
                    refusals[kind, call] = cell.startswith("refused")
    return refusals


REFUSED = documented_refusals()


def test_the_table_covers_every_kind_and_call() -> None:
    assert {(kind.name, call) for kind in ASYNC_KINDS for call in CALLS} <= set(REFUSED)


def cases() -> list[Any]:
    found = []
    for kind in ASYNC_KINDS:
        for call in CALLS:
            found.extend(
                pytest.param(kind, call, ending, id=f"{kind}-{call}-{ending}") for ending in ENDINGS
            )
    return found


async def assert_fresh_and_behaving(
    handle: AHandle, fresh: dict[str, object], observer: Any, name: str
) -> None:
    """The connection as the next user gets it: as a fresh one looks, and a rollback
    undoes while a transaction lock is held at the server."""
    async with handle.next_user() as following:
        pid = await following.pid()
        assert await following.fingerprint() == fresh
        tag = str(uuid.uuid4())
        await following.begin()
        await following.execute(f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'rolled back')")
        assert await pgsolo.xact_lock(following.conn, f"{name}:next-user").acquire()
        assert observer.holders(pgsolo.as_key(f"{name}:next-user")) == {pid}
        await following.rollback()
        assert observer.holders(pgsolo.as_key(f"{name}:next-user")) == set()
        assert work_rows(observer, tag) == []
        assert await following.fingerprint() == fresh


@pytest.mark.parametrize(("kind", "call", "ending"), cases())
async def test_every_call_leaves_the_connection_as_found(
    kind: AKind, call: str, ending: str, db: str, observer: Any, sync_connect: Connect
) -> None:
    name = f"as-found-{uuid.uuid4().hex}"
    tag = str(uuid.uuid4())
    async with kind.open(db) as handle:
        pid = await handle.pid()
        fresh = await handle.fingerprint()

        async def work() -> None:
            if call in OWNS_ITS_TRANSACTION:
                await handle.execute(f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'work')")
            else:  # the work's own transaction, begun and ended by the caller's library
                await handle.begin()
                await handle.execute(f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'work')")
                await handle.rollback()
            if ending == "raised":
                raise Boom
            if ending == "lost":
                terminate(observer, pid)

        perform = CALLS[call]
        holder = sync_connect()
        key = pgsolo.as_key(held_key(call, name))
        outcome: BaseException | None = None
        with pgsolo.session_lock(holder, key) as held:
            if ending in ("busy", "timed-out", "interrupted"):
                assert held.acquired
            else:
                held.release()
            try:
                if ending == "interrupted":
                    outcome = await ainterrupted(
                        lambda: perform(handle, name, WAITS["interrupted"], work),
                        lambda: observer.waiters(key),
                    )
                else:
                    await perform(handle, name, WAITS.get(ending), work)
            except BaseException as exc:  # every ending is judged below
                outcome = exc
        refused = isinstance(outcome, pgsolo.UsageError | pgsolo.ConnectionStateError)
        documented = REFUSED[kind.name, call]
        assert refused is documented, f"docs/connections.md says otherwise: {outcome!r}"
        if ending == "raised" and not refused:
            assert isinstance(outcome, Boom), f"the work's exception was replaced: {outcome!r}"
        if ending == "lost":
            assert outcome is None or isinstance(outcome, pgsolo.PgsoloError), repr(outcome)
            if kind.pooled:
                await assert_fresh_and_behaving(handle, fresh, observer, name)
            return
        if kind.implicit:
            await handle.rollback()  # the caller's own transaction, which its work began
        assert await handle.fingerprint() == fresh
        assert observer.advisory(pid=pid) == set()
        assert observer.advisory(pid=pid, granted=False) == set()
        if ending == "completed" and call in OWNS_ITS_TRANSACTION and not refused:
            assert outcome is None
            if not kind.implicit or call != "xact_lock":
                assert work_rows(observer, tag) == ["work"]
        if ending == "raised" and call in OWNS_ITS_TRANSACTION:
            assert work_rows(observer, tag) == []
        await assert_fresh_and_behaving(handle, fresh, observer, name)


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
@pytest.mark.parametrize("call", ["is_locked", "lock_holders", "advisory_locks"])
async def test_every_look_leaves_the_connection_as_found(
    kind: AKind, call: str, db: str, observer: Any
) -> None:
    looks = {
        "is_locked": pgsolo.is_locked_async,
        "lock_holders": pgsolo.lock_holders_async,
        "advisory_locks": lambda conn, name: pgsolo.advisory_locks_async(conn, key=name),
    }
    name = f"as-found-{uuid.uuid4().hex}"
    async with kind.open(db) as handle:
        pid = await handle.pid()
        fresh = await handle.fingerprint()
        begins = not kind.session_locks  # an ORM session has a connection only in one
        if begins:
            await handle.begin()
        before = await handle.fingerprint()
        await looks[call](handle.conn, name)
        assert await handle.fingerprint() == before
        if begins or kind.implicit:
            await handle.rollback()
        assert await handle.fingerprint() == fresh
        assert observer.advisory(pid=pid) == set()
        await assert_fresh_and_behaving(handle, fresh, observer, name)
