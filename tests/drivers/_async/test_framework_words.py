"""What pgsolo says on every kind of connection (``tests/_drivers.py``) is said in the
words of the caller's library or framework: the way to open a transaction it advises is
that library's (``with transaction.atomic():`` on Django, ``async with session.begin():``
on an AsyncSession), a connection's state is said in words (never libpq's ``intrans``),
and one cause is one reason code, whichever library reports it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import pgsolo
from _drivers import ASYNC_KINDS, AKind
from pgsolo import Key

# The kinds whose user opens transactions (``Kind.opens`` says how, as pgsolo must advise).
OWNING_KINDS = [kind for kind in ASYNC_KINDS if not kind.implicit]


async def refusal(lock: Any, error: type[pgsolo.PgsoloError]) -> str:
    """The message of ``error``, which ``lock.acquire()`` must raise."""
    with pytest.raises(error) as raised:
        await lock.acquire()
    return str(raised.value)


@pytest.mark.parametrize("kind", OWNING_KINDS, ids=str)
async def test_a_refused_transaction_lock_advises_the_kinds_own_transaction(
    kind: AKind, db: str, key: Key
) -> None:
    """Regression: a plain ``acquire()`` of a transaction lock with no transaction open
    advised ``with conn.transaction()`` (psycopg's API) on every kind: on Django it must
    say ``with transaction.atomic():``, on SQLAlchemy ``conn.begin()`` or
    ``session.begin()``, and in the flavour of the connection (``async with`` on an async
    one)."""
    async with kind.open(db) as conn:
        refused = await refusal(pgsolo.xact_lock(conn.conn, key), pgsolo.ConnectionStateError)
    # Matched whole, between its backquotes: never the tail of another flavour's hint.
    assert f"`{kind.opens}`" in refused


@pytest.mark.parametrize("kind", ASYNC_KINDS, ids=str)
async def test_a_job_refused_in_a_transaction_says_so_in_words(kind: AKind, db: str) -> None:
    """Regression: the refusal said ``(status intrans)``, libpq's word."""

    async def work(conn: Any) -> None:
        raise AssertionError("never runs")

    async with kind.open(db) as conn:
        await conn.begin()
        await conn.execute("SELECT 1")
        with pytest.raises(pgsolo.ConnectionStateError, match="a transaction is open") as raised:
            await pgsolo.run_job_async(conn.conn, f"words-{uuid.uuid4()}", work)
        await conn.rollback()
    assert "status" not in str(raised.value)


@pytest.mark.parametrize("kind", OWNING_KINDS, ids=str)
async def test_work_that_ends_a_transaction_job_s_transaction_is_one_reason(
    kind: AKind, db: str
) -> None:
    """Regression: work that commits the transaction of a transaction job (and goes on in
    another, as Django's and SQLAlchemy's books have it) was ``work-ended-transaction`` on
    psycopg but ``not-held-at-commit`` on Django and SQLAlchemy. One cause, one reason:
    ``work-ended-transaction`` on every kind."""
    async with kind.open(db) as conn:

        async def commits(_: Any) -> None:
            await conn.execute("COMMIT")

        result = await pgsolo.run_job_async(
            conn.conn, f"words-{uuid.uuid4()}", commits, lifetime="xact", raise_errors=False
        )
        assert result.outcome == "lost"
        assert result.reason == "work-ended-transaction"
        assert isinstance(result.error, pgsolo.LockLostError)
        assert result.error.reason == "work-ended-transaction"
        assert not await conn.in_transaction()


@pytest.mark.parametrize("kind", [k for k in ASYNC_KINDS if not k.session_locks], ids=str)
async def test_a_refused_session_lock_advises_in_the_callers_flavour(
    kind: AKind, db: str, key: Key
) -> None:
    """Regression: the refusal of a session lock on an ORM session advised the sync
    ``with engine.connect() as conn: ...`` on the async kind too: it advises the
    connection's own flavour (``async with`` for the async kind)."""
    async with kind.open(db) as conn:
        refused = await refusal(
            pgsolo.session_lock(conn.conn, key), pgsolo.UnsupportedConnectionError
        )
    assert "`async with engine.connect() as conn:`, then pass `conn`" in refused
