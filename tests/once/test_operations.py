"""``run_once`` / ``run_once_async`` against a real PostgreSQL: an operation runs once, then
every later call returns its stored result; a failure is recorded, rolled back, re-raised
and retried with the same idempotency key; an interrupted attempt stays started and is
taken over; operations that commit by themselves or swallow a database error.

Each behaviour is checked by what can be observed: the ``pgsolo.operations`` row, the
operation's own rows in the work table, ``pg_locks`` through the ``observer`` session,
how often the operation was called, and the values and errors the caller gets.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    IDLE,
    WORK,
    Boom,
    Connect,
    Ctx,
    eventually,
    locks_of,
    new_op,
    recorder,
    row_of,
    work_rows,
)
from pgsolo import (
    OnceResult,
    TransactionFailedError,
    run_once,
)
from pgsolo.once.operation import (
    lock_key_for,
)


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-begin"])
def test_runs_once_then_returns_the_stored_result(
    db: str, connect: Connect, observer: Any, autocommit: bool
) -> None:
    conn = connect(autocommit=autocommit)
    op = new_op()
    calls, operation = recorder({"charge": "ch_1", "amount": 1999, "tags": ("a", "b")})

    first = pgsolo.run_once(conn, op, operation)
    again = pgsolo.run_once(conn, op, operation)

    assert len(calls) == 1
    # the result is what reads back from JSON, the same whether it ran now or earlier
    stored = {"charge": "ch_1", "amount": 1999, "tags": ["a", "b"]}
    assert first == OnceResult("ran", op, calls[0].idempotency_key, stored, 1)
    assert again == OnceResult("already-succeeded", op, calls[0].idempotency_key, stored, 1)
    assert first.succeeded
    assert again.succeeded
    assert calls[0].attempt == 1
    assert calls[0].op_key == op
    assert calls[0].conn is conn
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["result"] == stored
    assert row["attempts"] == 1
    assert row["holder_pid"] == conn.info.backend_pid
    assert row["finished"] is not None
    assert work_rows(observer, op) == ["work"]
    assert conn.info.transaction_status == IDLE
    assert locks_of(observer, conn) == set()


def test_the_idempotency_key_is_derived_from_the_op_key_alone(db: str, connect: Connect) -> None:
    # The documented derivation (README), checked against an independent computation
    # and a fixed vector, so that a change to it can never slip through.
    op = "charge:order:8812"
    expected = (
        "pgsolo-" + hashlib.sha256(b"pgsolo idempotency key v1\0" + op.encode("utf-8")).hexdigest()
    )
    assert pgsolo.idempotency_key_for(op) == expected
    assert expected == "pgsolo-69081dae3a6de20eddc1de1528b58a6a1d7bb8727df905ce3c92196f0e8b782a"
    assert len(expected) == 71
    assert pgsolo.idempotency_key_for("charge:order:8813") != expected
    calls, operation = recorder()
    pgsolo.run_once(connect(), new_op(), operation)
    assert calls[0].idempotency_key == pgsolo.idempotency_key_for(calls[0].op_key)


def test_the_lock_is_held_while_the_operation_runs_and_only_then(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    op = new_op()
    seen: list[set[int]] = []

    def operation(ctx: Ctx) -> None:
        seen.append(observer.holders(lock_key_for(op)))

    pgsolo.run_once(conn, op, operation)
    assert seen == [{conn.info.backend_pid}]
    assert observer.holders(lock_key_for(op)) == set()


def test_a_failure_is_recorded_rolled_back_reraised_and_retried_with_the_same_key(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    op = new_op()
    contexts: list[Ctx] = []
    boom = Boom("the payment API timed out")

    def failing(ctx: Ctx) -> None:
        contexts.append(ctx)
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'lost')", (op,))
        raise boom

    with pytest.raises(Boom) as raised:
        pgsolo.run_once(conn, op, failing)
    assert raised.value is boom
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "failed"
    assert row["attempts"] == 1
    assert row["result"] is None
    assert row["error"] == "Boom: the payment API timed out"
    assert work_rows(observer, op) == []  # the attempt's database work was rolled back
    assert locks_of(observer, conn) == set()
    assert conn.info.transaction_status == IDLE

    calls, operation = recorder()
    retried = pgsolo.run_once(conn, op, operation)
    assert retried.outcome == "ran"
    assert retried.attempts == 2
    assert calls[0].attempt == 2
    assert calls[0].idempotency_key == contexts[0].idempotency_key
    assert work_rows(observer, op) == ["work"]
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["error"] is None


def test_a_stored_error_never_shows_the_connections_password(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    password = conn.info.password
    if not password:  # a server that trusts the connection ignores a password given to it
        marker = "s3cret-Pw-0nce"
        conn = connect(password=marker)
        password = conn.info.password
    op = new_op()

    def failing(ctx: Ctx) -> None:
        raise Boom(f"could not reach postgresql://app:{password}@db.internal/app")

    with pytest.raises(Boom):
        pgsolo.run_once(conn, op, failing)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "failed"
    assert password not in row["error"]
    assert "***" in row["error"]


def test_an_operation_that_swallows_a_database_error_fails_as_a_transaction(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    op = new_op()

    def swallowing(ctx: Ctx) -> str:
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'lost')", (op,))
        with contextlib.suppress(psycopg.errors.DivisionByZero):
            ctx.conn.execute("SELECT 1/0")
        return "done"

    with pytest.raises(TransactionFailedError):
        pgsolo.run_once(conn, op, swallowing)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "failed"
    assert "TransactionFailedError" in row["error"]
    assert work_rows(observer, op) == []
    assert conn.info.transaction_status == IDLE
    assert locks_of(observer, conn) == set()


def test_an_operation_that_commits_by_itself_still_records_its_success(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    conn = connect()
    op = new_op()

    def committing(ctx: Ctx) -> str:
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'committed')", (op,))
        ctx.conn.commit()
        return "done"

    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        result = pgsolo.run_once(conn, op, committing)
    assert result.outcome == "ran"
    assert row_of(observer, op) is not None
    assert work_rows(observer, op) == ["committed"]
    assert any("ended its own transaction" in r.getMessage() for r in caplog.records)


def test_an_interrupted_operation_stays_started_and_is_taken_over(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    op = new_op()
    keys: list[str] = []

    def interrupted(ctx: Ctx) -> None:
        keys.append(ctx.idempotency_key)
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'lost')", (op,))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pgsolo.run_once(conn, op, interrupted)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "started"
    assert row["finished"] is None
    assert work_rows(observer, op) == []
    assert locks_of(observer, conn) == set()

    calls, operation = recorder()
    result = pgsolo.run_once(connect(), op, operation)
    assert (result.outcome, result.attempts, calls[0].attempt) == ("ran", 2, 2)
    assert calls[0].idempotency_key == keys[0]


async def test_async_runs_once_and_fails_like_the_sync_one(
    db: str, aconnect: Any, observer: Any
) -> None:
    conn = await aconnect()
    op = new_op()
    calls: list[Any] = []

    async def failing(ctx: Any) -> None:
        calls.append(ctx)
        await ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'lost')", (op,))
        raise Boom("declined")

    async def charging(ctx: Any) -> dict[str, Any]:
        calls.append(ctx)
        await ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'work')", (op,))
        await asyncio.sleep(0)
        return {"charge": ctx.attempt}

    with pytest.raises(Boom):
        await pgsolo.run_once_async(conn, op, failing)
    ran = await pgsolo.run_once_async(conn, op, charging)
    again = await pgsolo.run_once_async(conn, op, charging)
    assert (ran.outcome, ran.result, ran.attempts) == ("ran", {"charge": 2}, 2)
    assert (again.outcome, again.result) == ("already-succeeded", {"charge": 2})
    assert len(calls) == 2
    assert calls[0].idempotency_key == calls[1].idempotency_key
    assert calls[1].conn is conn
    assert work_rows(observer, op) == ["work"]
    assert locks_of(observer, conn) == set()


# -- found in review -----------------------------------------------------------------------


def test_an_autocommit_off_operation_without_database_work_does_not_warn(
    db: str, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    """On an autocommit=False connection, an operation that does no database work makes
    pgsolo warn that it 'ended its own transaction: its database work committed apart
    from the record of its success' - which is false: there was no work and no commit."""
    conn = connect(autocommit=False)
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        result = run_once(conn, new_op("review2"), lambda ctx: 1)
    assert result.outcome == "ran"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, warnings


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this error")


def test_an_exception_that_cannot_be_printed_is_still_recorded_and_reraised(
    db: str, connect: Connect
) -> None:
    """The failure path formats the error (f"{exc}") inside the except block, before any
    clean-up: if that raises, the attempt is not recorded as failed, the caller gets the
    formatting error instead of its own, and the operation's transaction is left open on
    an autocommit connection."""
    conn = connect()
    op_key = new_op("review2")

    def operation(ctx: Ctx) -> None:
        raise Unprintable

    with pytest.raises(Unprintable):
        run_once(conn, op_key, operation)
    assert conn.info.transaction_status == IDLE, conn.info.transaction_status.name


def test_the_connections_password_is_not_stored_in_the_error(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The server's own password when it asks for one (CI's PostgreSQL 15); otherwise
    # (trust authentication) one with quotes, backslashes and spaces, which it accepts.
    """An operation's error text that contains the connection's own password (with a quote, a
    backslash and spaces where the server accepts one) is stored and logged without it: the
    message is kept, the password never."""
    secret = connect().info.password or "pw with 'quote\\ and space"
    conn = connect(password=secret)
    op_key = new_op("review2")

    def operation(ctx: Ctx) -> None:
        raise ValueError(f"login failed for {secret}!")

    with (
        caplog.at_level(logging.WARNING, logger="pgsolo"),
        pytest.raises(ValueError, match="login failed"),
    ):
        run_once(conn, op_key, operation)
    (error,) = observer.conn.execute(
        "SELECT error FROM pgsolo.operations WHERE op_key = %s", (op_key,)
    ).fetchone()
    assert "login failed" in error
    assert secret not in error, error
    assert secret not in caplog.text


def _closed_by_the_server(observer: Any, op: str) -> bool:
    """True once the server has no session named for ``op``. A backend leaves
    ``pg_stat_activity`` a few milliseconds after its client said goodbye, so a check
    right after the close would race the server; a connection never closed stays."""
    return _own_backends(observer, op) == 0


def _own_backends(observer: Any, op: str) -> int:
    row = observer.conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        (f"pgsolo:once:{op}"[:63],),
    ).fetchone()
    return int(row[0])


def test_a_connection_string_runs_the_operation_on_a_connection_of_pgsolos_own(
    db: str, observer: Any
) -> None:
    """Guards: ``run_once`` took only a connection while ``run_job`` takes a connection
    string too. Given one, it opens a connection named ``pgsolo:once:<op_key>``, runs and
    stores the operation's work in one transaction there, and closes it."""
    op = new_op()
    seen: list[tuple[str, int]] = []

    def operation(ctx: Ctx) -> str:
        name = ctx.conn.execute("SELECT current_setting('application_name')").fetchone()
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'charged')", (op,))
        seen.append((name[0], _own_backends(observer, op)))
        return "ch_1"

    first = run_once(db, op, operation)
    again = run_once(db, op, operation)

    assert (first.outcome, first.result) == ("ran", "ch_1")
    assert (again.outcome, again.result) == ("already-succeeded", "ch_1")
    assert seen == [(f"pgsolo:once:{op}", 1)]
    assert work_rows(observer, op) == ["charged"]
    row = row_of(observer, op)
    assert row is not None
    assert (row["state"], row["attempts"]) == ("succeeded", 1)
    eventually(lambda: _closed_by_the_server(observer, op), "pgsolo's own connection to close")


async def test_an_async_connection_string_runs_the_operation_and_closes(
    db: str, observer: Any
) -> None:
    """The same for ``run_once_async``, on an async connection of pgsolo's own."""
    op = new_op()

    async def operation(ctx: Any) -> int:
        assert isinstance(ctx.conn, psycopg.AsyncConnection)
        await ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'async')", (op,))
        return 7

    result = await pgsolo.run_once_async(db, op, operation)

    assert (result.outcome, result.result) == ("ran", 7)
    assert work_rows(observer, op) == ["async"]
    eventually(lambda: _closed_by_the_server(observer, op), "pgsolo's own connection to close")
