"""The behaviours every kind of connection must show the same, each against the real
server, in the manner of DistributedLock's shared provider tests: the kinds are in
``tests/_drivers.py`` (this module and its generated twin take one flavour each), and a
new driver joins every test by adding its kind there.

What each kind must do: take and let go of a key, see a key held through any other kind
as busy, bound a wait and leave nothing behind when it runs out, follow the caller's
transaction (join it, never end it) and end the one pgsolo opens with the block, issue
fencing tokens, run a job on the caller's connection, list what it holds, and refuse a
hot standby and a session lock behind a transaction pooler.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AHandle, AKind
from _support import WORK, Boom, Connect, aeventually, terminate, wait_until_lost, work_rows
from pgsolo import Key
from pgsolo.keys import leader_key, semaphore_keys
from pgsolo.testing import Bouncer, Replicas

OWNING_KINDS = [kind for kind in ASYNC_KINDS if not kind.implicit]


@asynccontextmanager
async def holding(kind: AKind, conn: AHandle, key: Key) -> AsyncIterator[None]:
    """``key`` held through ``conn``: by a session lock, or, on a kind that takes none (an
    ORM session), by a transaction lock in the caller's transaction."""
    if kind.session_locks:
        async with pgsolo.session_lock(conn.conn, key) as lock:
            assert lock.acquired
            yield
        return
    await conn.begin()
    try:
        assert await pgsolo.xact_lock(conn.conn, key).acquire()
        yield
    finally:
        await conn.rollback()


def locks_of(kind: AKind, conn: AHandle, key: Key, wait: float | None = None) -> list[Any]:
    """A lock of each lifetime this kind takes, as context managers."""
    locks = [pgsolo.xact_lock(conn.conn, key, wait=wait)]
    if kind.session_locks:
        locks.append(pgsolo.session_lock(conn.conn, key, wait=wait))
    return locks


def take_and_let_go(conn: Any, key: str) -> None:
    """Wait for ``key`` through ``conn`` (a waiter, until its holder lets go), then let go."""
    with pgsolo.session_lock(conn, key, wait=30) as lock:
        assert lock.acquired


def note_statement(tag: str) -> str:
    """A row of the test's own (``tag`` is a fresh uuid: nothing to quote)."""
    return f"INSERT INTO {WORK} (job, note) VALUES ('{tag}', 'written')"


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_key_is_taken_and_let_go(kind: AKind, db: str, observer: Any, key: Key) -> None:
    async with kind.open(db) as conn:
        pid = await conn.pid()
        if kind.session_locks:
            async with pgsolo.session_lock(conn.conn, key) as lock:
                assert lock.acquired
                assert observer.holders(key) == {pid}
            assert observer.holders(key) == set()
        async with pgsolo.xact_lock(conn.conn, key, wait=5) as lock:
            assert lock.acquired
            assert observer.holders(key) == {pid}
        if kind.implicit:  # the lock is in the caller's transaction, which goes on
            assert observer.holders(key) == {pid}
            await conn.rollback()
        assert observer.holders(key) == set()
        assert not await conn.in_transaction()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_key_held_through_one_kind_is_busy_through_every_other(
    kind: AKind, db: str, observer: Any, key: Key, sync_connect: Connect
) -> None:
    async with kind.open(db) as holder:
        async with holding(kind, holder, key):
            for other in ASYNC_KINDS:
                async with other.open(db) as conn:
                    for lock in locks_of(other, conn, key):
                        async with lock:
                            assert not lock.acquired, f"{other} took a key {kind} holds"
                    if other.implicit:
                        await conn.rollback()
            with pgsolo.session_lock(sync_connect(), key) as lock:
                assert not lock.acquired
        assert observer.holders(key) == set()
    # And the other way round: a key held through psycopg 3 is busy through this kind.
    with pgsolo.session_lock(sync_connect(), key) as held:
        assert held.acquired
        async with kind.open(db) as conn:
            for lock in locks_of(kind, conn, key):
                async with lock:
                    assert not lock.acquired
            if kind.implicit:
                await conn.rollback()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_wait_runs_out_with_nothing_left_behind(
    kind: AKind, db: str, observer: Any, key: Key, sync_connect: Connect
) -> None:
    with pgsolo.session_lock(sync_connect(), key) as held:
        assert held.acquired
        async with kind.open(db) as conn:
            for lock in locks_of(kind, conn, key, wait=0.2):
                with pytest.raises(pgsolo.LockTimeoutError):
                    await lock.__aenter__()
            assert observer.waiters(key) == set()
            if kind.implicit:
                await conn.rollback()
            assert not await conn.in_transaction()
            await conn.execute("SELECT 1")  # still usable
        assert observer.holders(key) == {held.backend_pid}


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_wait_gets_the_key_when_its_holder_lets_go(
    kind: AKind, db: str, observer: Any, key: Key, sync_connect: Connect
) -> None:
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire()
    letting_go = threading.Timer(0.3, holder.release)
    async with kind.open(db) as conn:
        letting_go.start()
        try:
            async with locks_of(kind, conn, key, wait=10)[-1] as lock:
                assert lock.acquired
                assert observer.holders(key) == {await conn.pid()}
            if kind.implicit:
                await conn.rollback()
        finally:
            letting_go.join()
        assert observer.holders(key) == set()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_wait_of_many_slices_runs_out_or_gets_the_key_with_nothing_left(
    kind: AKind, db: str, observer: Any, key: Key, sync_connect: Connect, short_slices: float
) -> None:
    """A wait runs in slices (issue 22: so that it never holds back VACUUM), each in a
    transaction or savepoint of its own that a slice running out rolls back, through the
    framework's own API when pgsolo's transaction is the framework's: on every kind a
    wait of several slices runs out on time with nothing left, and one gets the key when
    its holder lets go, the framework's books as found."""
    holder = pgsolo.session_lock(sync_connect(), key)
    assert holder.acquire()
    async with kind.open(db) as conn:
        for lock in locks_of(kind, conn, key, wait=4 * short_slices):
            with pytest.raises(pgsolo.LockTimeoutError):
                await lock.__aenter__()
        assert observer.waiters(key) == set()
        if kind.implicit:
            await conn.rollback()
        assert not await conn.in_transaction()
        letting_go = threading.Timer(4 * short_slices, holder.release)
        letting_go.start()
        try:
            async with locks_of(kind, conn, key, wait=30)[-1] as lock:
                assert lock.acquired
                assert observer.holders(key) == {await conn.pid()}
            if kind.implicit:
                await conn.rollback()
        finally:
            letting_go.join()
        assert not await conn.in_transaction()
        await conn.execute("SELECT 1")  # still usable
    assert observer.holders(key) == set()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_transaction_lock_joins_the_callers_transaction_and_never_ends_it(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """The lock follows the transaction the caller believes it is in: the caller's
    rollback undoes what the block wrote and only then lets the key go. (On an
    ``autocommit=False`` connection, inside Django's ``atomic()`` and inside SQLAlchemy's
    ``begin()``, the block once committed its rows, and the rollback kept them.)"""
    tag = str(uuid.uuid4())
    async with kind.open(db) as conn:
        pid = await conn.pid()
        await conn.begin()
        async with pgsolo.xact_lock(conn.conn, key, wait=5) as lock:
            assert lock.acquired
            await conn.execute(note_statement(tag))
        assert await conn.in_transaction()
        assert observer.holders(key) == {pid}  # until the caller ends its transaction
        await conn.rollback()
        assert observer.holders(key) == set()
        assert not await conn.in_transaction()
    assert work_rows(observer, tag) == []


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_transaction_lock_taken_in_a_savepoint_goes_with_its_rollback(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """What docs/connections.md says of savepoints (psycopg's nested ``transaction()``,
    asyncpg's, SQLAlchemy's ``begin_nested()``, Django's nested ``atomic()``): a
    transaction lock taken in one that rolls back is released at once, with the
    savepoint's work; in one that is released, it lasts until the outer transaction ends."""
    async with kind.open(db) as conn:
        pid = await conn.pid()
        await conn.begin()
        await conn.execute("SELECT 1")  # with autocommit off, the transaction opens here

        async def failing_savepoint() -> None:
            async with conn.savepoint():
                assert await pgsolo.xact_lock(conn.conn, key).acquire()
                assert observer.holders(key) == {pid}
                raise Boom

        with pytest.raises(Boom):
            await failing_savepoint()
        assert observer.holders(key) == set()  # the outer transaction goes on without it
        assert await conn.in_transaction()
        async with conn.savepoint():
            assert await pgsolo.xact_lock(conn.conn, key).acquire()
        assert observer.holders(key) == {pid}
        await conn.rollback()
        assert observer.holders(key) == set()


SESSION_KINDS = [kind for kind in ASYNC_KINDS if kind.session_locks]


async def lead_or_fail(conn: Any, name: str, *, wait: float) -> None:
    """Stand for ``name`` through ``conn``, unwatched, for ``wait`` seconds: a test that
    expects the candidacy to raise fails if it leads instead."""
    async with pgsolo.leader_async(conn, name, wait=wait, keep=False):
        pytest.fail(f"led {name!r} where another leads, or where no leader may")


def apart_from(kind: AKind) -> list[AKind]:
    """The kinds whose connections, opened while one of ``kind`` is, are other sessions."""
    return [other for other in SESSION_KINDS if not (other.per_thread and other == kind)]


@pytest.mark.parametrize("kind", SESSION_KINDS, ids=str)
async def test_a_session_lock_in_a_failed_savepoint_costs_the_caller_that_savepoint_only(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """A session lock released in a transaction that failed inside its block undoes the
    block's work only: the caller rolls back to its savepoint, and its rows before the
    savepoint and after it commit, with the key let go. (The release once sent ROLLBACK,
    which ended the caller's whole transaction: the rows before were lost and the later
    ones committed on their own, or Django's outer ``atomic()`` failed.)"""
    before, inside, after = (str(uuid.uuid4()) for _ in range(3))
    async with kind.open(db) as conn:
        await conn.begin()
        await conn.execute(note_statement(before))

        async def failing_savepoint() -> None:
            async with conn.savepoint(), pgsolo.session_lock(conn.conn, key) as lock:
                assert lock.acquired
                await conn.execute(note_statement(inside))
                await conn.execute("SELECT 1/0")

        with pytest.raises(Exception, match="division by zero") as failure:  # the library's own
            await failing_savepoint()
        assert not isinstance(failure.value, pgsolo.PgsoloError)  # the caller's, untouched
        assert observer.holders(key) == set()
        assert await conn.in_transaction()
        await conn.execute(note_statement(after))
        await conn.commit()
        assert not await conn.in_transaction()
    assert work_rows(observer, before) == ["written"]
    assert work_rows(observer, inside) == []
    assert work_rows(observer, after) == ["written"]


@pytest.mark.parametrize("kind", OWNING_KINDS, ids=str)
async def test_the_transaction_pgsolo_opens_ends_with_the_block(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    committed, rolled_back = str(uuid.uuid4()), str(uuid.uuid4())
    async with kind.open(db) as conn:
        async with pgsolo.xact_lock(conn.conn, key) as lock:
            assert lock.acquired
            assert await conn.in_transaction()
            await conn.execute(note_statement(committed))
        assert not await conn.in_transaction()
        assert observer.holders(key) == set()

        async def failing_block() -> None:
            async with pgsolo.xact_lock(conn.conn, key) as lock:
                assert lock.acquired
                await conn.execute(note_statement(rolled_back))
                raise Boom

        with pytest.raises(Boom):
            await failing_block()
        assert not await conn.in_transaction()
        assert observer.holders(key) == set()
        await conn.execute("SELECT 1")  # still usable
    assert work_rows(observer, committed) == ["written"]
    assert work_rows(observer, rolled_back) == []


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_lock_names_the_backend_that_holds_it(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """Guards lock.backend_pid on a connection that reaches a backend only as the lock is
    taken (an ORM session with nothing checked out): it was read before, and said 0."""
    async with kind.open(db) as conn:
        for lock in locks_of(kind, conn, key):
            async with lock:
                assert observer.holders(key) == {lock.backend_pid} == {await conn.pid()}


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_fencing_tokens_only_go_up(kind: AKind, db: str, key: Key) -> None:
    async with kind.open(db) as conn:
        first_lock = pgsolo.session_lock if kind.session_locks else pgsolo.xact_lock
        async with first_lock(conn.conn, key, fencing=True) as lock:
            first = lock.token
        if kind.implicit:
            await conn.rollback()
        async with pgsolo.xact_lock(conn.conn, key, fencing=True) as lock:
            second = lock.token
        if kind.implicit:
            await conn.rollback()
    assert first is not None
    assert second is not None
    assert second > first


@pytest.mark.parametrize("kind", OWNING_KINDS, ids=str)
async def test_a_job_runs_on_the_callers_connection(
    kind: AKind, db: str, observer: Any, sync_connect: Connect
) -> None:
    job = f"conformance-{uuid.uuid4()}"
    seen: list[object] = []

    async def work(conn: Any) -> str:
        seen.append(conn)
        return "done"

    async with kind.open(db) as conn:
        result = await pgsolo.run_job_async(conn.conn, job, work)
        assert result.completed
        assert result.value == "done"
        assert seen == [conn.conn]
        assert not await conn.in_transaction()
        with pgsolo.session_lock(sync_connect(), job) as held:
            assert held.acquired
            busy = await pgsolo.run_job_async(conn.conn, job, work)
        assert busy.outcome == "skipped"
        assert busy.reason == "busy"
        assert seen == [conn.conn]


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_standby_is_refused_and_nothing_is_taken(
    kind: AKind, replicas: Replicas, key: Key
) -> None:
    """A hot standby grants advisory locks nobody else sees: every kind refuses it, by the
    same SQL-side check, before anything is held."""
    async with kind.open(replicas.standby_dsn) as conn:
        for lock in [*locks_of(kind, conn, key), *locks_of(kind, conn, key, wait=1)]:
            with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
                await lock.__aenter__()
            assert refused.value.reason == "server-in-recovery"
        if kind.implicit:
            await conn.rollback()
        assert not await conn.in_transaction()
        await conn.execute("SELECT 1")  # still usable


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_what_a_kind_holds_is_listed_through_it(kind: AKind, db: str, key: Key) -> None:
    async with kind.open(db) as conn, holding(kind, conn, key):
        pid = await conn.pid()
        locks = await pgsolo.advisory_locks_async(conn.conn, key=key)
        assert [(lock.key, lock.pid, lock.granted) for lock in locks] == [(key, pid, True)]
        if kind.session_locks:
            assert pgsolo.held_session_locks(conn.conn) == [key]


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_who_holds_a_key_is_seen_through_every_kind(
    kind: AKind, db: str, observer: Any, sync_connect: Connect
) -> None:
    """is_locked and lock_holders through this kind see another session's lock (taken by
    name: the same key parser), say who it is, never count a waiter, and see it go."""
    name = f"holders-{uuid.uuid4().hex}"
    holder = sync_connect(application_name="the-holder")
    holder_pid = holder.info.backend_pid
    async with kind.open(db) as conn:
        if not kind.session_locks:  # an ORM session has a connection only in a transaction
            await conn.begin()
        assert not await pgsolo.is_locked_async(conn.conn, name)
        assert await pgsolo.lock_holders_async(conn.conn, name) == []
        waiter = sync_connect()
        with pgsolo.session_lock(holder, name) as held:
            assert held.acquired
            waiting = threading.Thread(target=take_and_let_go, args=(waiter, name))
            waiting.start()
            await aeventually(lambda: observer.waiters(pgsolo.as_key(name)), "a waiter")
            assert await pgsolo.is_locked_async(conn.conn, name)
            holders = await pgsolo.lock_holders_async(conn.conn, name)
            assert [(h.pid, h.application_name, h.name, h.granted) for h in holders] == [
                (holder_pid, "the-holder", name, True)
            ]
            assert holders[0].key == pgsolo.as_key(name)
            assert holders[0].since is not None
        waiting.join()
        assert not await pgsolo.is_locked_async(conn.conn, name)
        if kind.implicit or not kind.session_locks:
            await conn.rollback()
        assert not await conn.in_transaction()


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_behind_a_transaction_pooler_only_transaction_locks_are_taken(
    kind: AKind, bouncer: Bouncer, observer: Any, key: Key
) -> None:
    """A transaction-pooling PgBouncer hands each transaction to any server session: a
    session lock would stay on one the client no longer talks to. Every kind finds that
    out from what the server says, and refuses it before anything is held."""
    async with kind.open(bouncer.dsn) as conn:
        if kind.session_locks:
            with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
                await pgsolo.session_lock(conn.conn, key).__aenter__()
            assert refused.value.reason == "transaction-pooling"
            assert observer.holders(key) == set()
        async with pgsolo.xact_lock(conn.conn, key) as lock:
            assert lock.acquired
        if kind.implicit:
            await conn.rollback()
    assert observer.holders(key) == set()


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if k.session_locks], ids=str)
async def test_the_keeper_watches_a_lock_or_is_refused_before_any_sql(
    kind: AKind, db: str, observer: Any, key: Key
) -> None:
    """Where a heartbeat can share the connection, the keeper sees the backend end; where
    it cannot (psycopg2, asyncpg), ``keep=`` is a UsageError and nothing is taken."""
    keep = pgsolo.Keep(interval=0.1, timeout=5)
    async with kind.open(db) as conn:
        if not kind.keeper:
            with pytest.raises(pgsolo.UsageError, match="keep="):
                pgsolo.session_lock(conn.conn, key, keep=keep)
            assert observer.holders(key) == set()
            return
        lock = pgsolo.session_lock(conn.conn, key, keep=keep)
        assert await lock.acquire()
        terminate(observer, await conn.pid())
        await wait_until_lost(lock, poll=aeventually)
        assert lock.loss is not None
        assert lock.loss.reason == "connection-lost"


SESSION_KINDS = [kind for kind in ASYNC_KINDS if kind.session_locks]


@pytest.mark.parametrize("kind", SESSION_KINDS, ids=str)
async def test_a_leader_leads_while_a_candidate_through_every_kind_waits(
    kind: AKind, db: str, observer: Any
) -> None:
    """A term through this kind (watched where a keeper can share the connection): the
    leader's key is held by its session, a candidate through any other kind waits and
    gives up with nothing held, each term's token is larger than the last, and the
    connection ends as it was found."""
    name = f"conformance-{uuid.uuid4()}"
    tokens = []
    async with kind.open(db) as conn:
        pid = await conn.pid()
        for _ in range(2):
            async with pgsolo.leader_async(conn.conn, name, keep=kind.keeper) as term:
                assert observer.holders(term.key) == {pid}
                tokens.append(term.token)
                for other in apart_from(kind):
                    async with other.open(db) as candidate:
                        with pytest.raises(pgsolo.LockTimeoutError):
                            await lead_or_fail(candidate.conn, name, wait=0.2)
                        assert not await candidate.in_transaction()
            assert observer.holders(term.key) == set()
        assert not await conn.in_transaction()
    assert tokens[0] is not None
    assert tokens[1] is not None
    assert tokens[1] > tokens[0]


@pytest.mark.parametrize("kind", SESSION_KINDS, ids=str)
async def test_a_semaphore_admits_its_limit_through_every_kind(
    kind: AKind, db: str, observer: Any
) -> None:
    """Two holders of a limit of 2, through this kind and psycopg, hold its two slots; a
    third, through any kind, gets none (a try, then a wait that runs out) and holds nothing
    after."""
    name = f"conformance-{uuid.uuid4()}"
    async with kind.open(db) as first, SESSION_KINDS[0].open(db) as second:
        async with (
            pgsolo.semaphore(first.conn, name, limit=2) as one,
            pgsolo.semaphore(second.conn, name, limit=2) as two,
        ):
            assert one.acquired
            assert two.acquired
            assert {one.slot, two.slot} == {0, 1}
            assert one.key is not None
            assert observer.holders(one.key) == {await first.pid()}
            for other in apart_from(kind):
                async with other.open(db) as third:
                    async with pgsolo.semaphore(third.conn, name, limit=2) as three:
                        assert not three.acquired, f"{other} took a third slot of 2"
                    with pytest.raises(pgsolo.LockTimeoutError):
                        await pgsolo.semaphore(third.conn, name, limit=2, wait=0.3).acquire()
                    assert not await third.in_transaction()
        for key in semaphore_keys(name, 2):
            assert observer.holders(key) == set()
            assert observer.waiters(key) == set()
        assert not await first.in_transaction()
        assert not await second.in_transaction()


@pytest.mark.parametrize("kind", SESSION_KINDS, ids=str)
async def test_behind_a_transaction_pooler_no_leader_or_semaphore_is_taken(
    kind: AKind, bouncer: Bouncer, observer: Any
) -> None:
    """A leader and a semaphore hold session locks: behind a transaction pooler each is
    refused, as a session lock is, with nothing held."""
    name = f"conformance-{uuid.uuid4()}"
    async with kind.open(bouncer.dsn) as conn:
        with pytest.raises(pgsolo.UnsafeConnectionError) as refused:
            await lead_or_fail(conn.conn, name, wait=1)
        assert refused.value.reason == "transaction-pooling"
        with pytest.raises(pgsolo.UnsafeConnectionError):
            await pgsolo.semaphore(conn.conn, name, limit=2).acquire()
    assert observer.holders(leader_key(name)) == set()
    for key in semaphore_keys(name, 2):
        assert observer.holders(key) == set()
