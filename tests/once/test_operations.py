"""Operation keys (``pgsolo.once``) against a real PostgreSQL: the API, its states, bad input.

Each behaviour is checked by what can be observed: the ``pgsolo.operations`` row, the
operation's own rows in the work table, ``pg_locks`` through the ``observer`` session,
how often the operation was called, and the values and errors the caller gets.
Concurrency uses real threads, each on its own connection. Crashes (SIGKILL of a child
process at each step) are in ``test_once_crash.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import WORK, eventually, work_rows
from pgsolo import (
    ConnectionStateError,
    InvalidOperationError,
    InvalidOperationKeyError,
    LockLostError,
    OnceResult,
    OperationContext,
    ResultNotStorableError,
    TransactionFailedError,
    UsageError,
)
from pgsolo.once.operation import (
    MAX_OP_KEY_BYTES,
    MAX_RESULT_BYTES,
    lock_key_for,
    storable_result,
)

Connect = Callable[..., psycopg.Connection]
Ctx = OperationContext[psycopg.Connection]
IDLE = psycopg.pq.TransactionStatus.IDLE
DEADLINE = 10.0


class Boom(Exception):
    """The operation's own failure."""


def new_op() -> str:
    return f"once-test:{uuid.uuid4().hex[:16]}"


def row_of(observer: Any, op_key: str) -> dict[str, Any] | None:
    row = observer.conn.execute(
        "SELECT state, attempts, idempotency_key, result, error, holder_pid, finished_at"
        " FROM pgsolo.operations WHERE op_key = %s",
        (op_key,),
    ).fetchone()
    if row is None:
        return None
    names = ("state", "attempts", "idempotency_key", "result", "error", "holder_pid", "finished")
    return dict(zip(names, row, strict=True))


def locks_of(observer: Any, conn: psycopg.Connection | psycopg.AsyncConnection) -> set[Any]:
    return observer.advisory(pid=conn.info.backend_pid)  # type: ignore[no-any-return]


def recorder(result: object = "done") -> tuple[list[Any], Callable[[Ctx], object]]:
    """An operation that writes a work row and remembers each context it was given."""
    calls: list[Any] = []

    def operation(ctx: Ctx) -> object:
        calls.append(ctx)
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (ctx.op_key, "work"))
        return result

    return calls, operation


# -- the happy path --------------------------------------------------------------------------


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


# -- failures ----------------------------------------------------------------------------


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


# -- results that cannot be stored ----------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {"amount": math.nan},
        {"amount": math.inf},
        {1j: "complex key"},
        b"bytes",
        {"note": "a\0b"},
        {"a\0b": 1},
        ["\ud800"],
        "x" * (MAX_RESULT_BYTES - 1),  # two quotes make it one byte too many
    ],
    ids=["object", "nan", "inf", "bad-key", "bytes", "nul", "nul-key", "surrogate", "too-large"],
)
def test_results_that_cannot_be_stored_are_refused(value: object) -> None:
    with pytest.raises(ResultNotStorableError) as raised:
        storable_result(value)
    assert isinstance(raised.value, UsageError)
    assert isinstance(raised.value, ValueError)


def test_the_largest_storable_result_is_stored(db: str, connect: Connect, observer: Any) -> None:
    largest = "é" * ((MAX_RESULT_BYTES - 2) // 2)  # two bytes each, plus two quotes
    assert len(storable_result(largest).encode()) == MAX_RESULT_BYTES
    op = new_op()
    assert pgsolo.run_once(connect(), op, lambda ctx: largest).result == largest
    row = row_of(observer, op)
    assert row is not None
    assert row["result"] == largest


@pytest.mark.parametrize(
    "value", [object(), "x" * MAX_RESULT_BYTES, {"n": math.nan}], ids=["object", "large", "nan"]
)
def test_a_result_that_cannot_be_stored_commits_nothing_and_is_retried_with_the_same_key(
    db: str, connect: Connect, observer: Any, value: object
) -> None:
    conn = connect()
    op = new_op()
    calls, operation = recorder(value)

    with pytest.raises(ResultNotStorableError):
        pgsolo.run_once(conn, op, operation)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "failed"
    assert row["result"] is None
    assert "ResultNotStorableError" in row["error"]
    assert work_rows(observer, op) == []  # not committed without its record
    assert locks_of(observer, conn) == set()
    assert conn.info.transaction_status == IDLE

    fixed_calls, fixed = recorder("ok")
    assert pgsolo.run_once(conn, op, fixed).attempts == 2
    assert fixed_calls[0].idempotency_key == calls[0].idempotency_key
    assert work_rows(observer, op) == ["work"]


# -- bad input: a typed error, and nothing ran, was written or is held ----------------------


BAD_OP_KEYS = [
    ("", "empty"),
    ("x" * (MAX_OP_KEY_BYTES + 1), "too-long"),
    ("é" * (MAX_OP_KEY_BYTES // 2) + "x", "too-long-utf8"),
    ("charge:\0order", "nul"),
    ("\udc80", "surrogate"),
    (b"charge:order:1", "bytes"),
    (8812, "int"),
    (None, "none"),
]


@pytest.mark.parametrize("op_key", [k for k, _ in BAD_OP_KEYS], ids=[i for _, i in BAD_OP_KEYS])
def test_bad_operation_keys_are_refused_before_anything_runs(
    db: str, connect: Connect, observer: Any, op_key: object
) -> None:
    calls, operation = recorder()
    before = observer.conn.execute("SELECT count(*) FROM pgsolo.operations").fetchone()
    conn = connect()
    with pytest.raises(InvalidOperationKeyError) as raised:
        pgsolo.run_once(conn, op_key, operation)  # type: ignore[arg-type]
    assert isinstance(raised.value, UsageError)
    assert isinstance(raised.value, ValueError)
    assert calls == []
    assert observer.conn.execute("SELECT count(*) FROM pgsolo.operations").fetchone() == before
    assert locks_of(observer, conn) == set()
    # before any SQL: a closed connection gives the same error, not a connection error
    conn.close()
    with pytest.raises(InvalidOperationKeyError):
        pgsolo.run_once(conn, op_key, operation)  # type: ignore[arg-type]


def test_the_longest_operation_key_is_accepted(db: str, connect: Connect, observer: Any) -> None:
    op = "é" * (MAX_OP_KEY_BYTES // 2)
    assert len(op.encode()) == MAX_OP_KEY_BYTES
    observer.conn.execute("DELETE FROM pgsolo.operations WHERE op_key = %s", (op,))
    assert pgsolo.run_once(connect(), op, lambda ctx: 1).outcome == "ran"


async def _async_operation(ctx: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("operation", "wait", "error"),
    [
        ("not callable", None, InvalidOperationError),
        (None, None, InvalidOperationError),
        (_async_operation, None, InvalidOperationError),
        (lambda ctx: 1, 0, UsageError),
        (lambda ctx: 1, -1, UsageError),
        (lambda ctx: 1, math.nan, UsageError),
        (lambda ctx: 1, 10**9, UsageError),
        (lambda ctx: 1, "1", UsageError),
        (lambda ctx: 1, True, UsageError),
    ],
    ids=[
        "str",
        "none",
        "async-fn",
        "wait-0",
        "wait-neg",
        "wait-nan",
        "wait-huge",
        "wait-str",
        "wait-bool",
    ],
)
def test_bad_operations_and_waits_are_refused_before_anything_runs(
    db: str, connect: Connect, observer: Any, operation: Any, wait: Any, error: type[Exception]
) -> None:
    op = new_op()
    conn = connect()
    with pytest.raises(error):
        pgsolo.run_once(conn, op, operation, wait=wait)
    assert row_of(observer, op) is None
    assert locks_of(observer, conn) == set()
    conn.close()
    with pytest.raises(error):
        pgsolo.run_once(conn, op, operation, wait=wait)


def test_a_connection_inside_a_transaction_is_refused(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    op = new_op()
    calls, operation = recorder()
    with conn.transaction(), pytest.raises(ConnectionStateError, match="no transaction open"):
        pgsolo.run_once(conn, op, operation)
    assert calls == []
    assert row_of(observer, op) is None


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-begin"])
def test_before_migrate_is_a_usage_error_and_nothing_runs(
    fresh_db: str, observer: Any, autocommit: bool
) -> None:
    calls, operation = recorder()
    with psycopg.connect(fresh_db, autocommit=autocommit) as conn:
        with pytest.raises(UsageError, match="pgsolo migrate"):
            pgsolo.run_once(conn, new_op(), operation)
        assert calls == []
        assert conn.info.transaction_status == IDLE
        assert locks_of(observer, conn) == set()


# -- concurrency: live holders, waits, takeovers --------------------------------------------


class Holder:
    """A thread running an operation that blocks until released."""

    def __init__(self, connect: Connect, op: str, result: object = "held") -> None:
        self.conn = connect()
        self.op = op
        self.running = threading.Event()
        self.release = threading.Event()
        self.outcome: OnceResult | BaseException | None = None
        self.contexts: list[Ctx] = []

        def operation(ctx: Ctx) -> object:
            self.contexts.append(ctx)
            ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'holder')", (op,))
            self.running.set()
            assert self.release.wait(DEADLINE), "the test never released the holder"
            return result

        def run() -> None:
            try:
                self.outcome = pgsolo.run_once(self.conn, op, operation)
            except BaseException as exc:
                self.outcome = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.running.wait(DEADLINE)

    def finish(self) -> OnceResult | BaseException | None:
        self.release.set()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()
        return self.outcome


def test_a_live_holder_makes_others_skip_or_wait_and_never_run(
    db: str, connect: Connect, observer: Any
) -> None:
    op = new_op()
    holder = Holder(connect, op, result={"by": "holder"})
    calls, operation = recorder()
    other = connect()
    try:
        skipped = pgsolo.run_once(other, op, operation)
        assert skipped.outcome == "skipped-busy"
        assert not skipped.succeeded
        assert skipped.result is None
        assert skipped.attempts == 1
        assert skipped.idempotency_key == holder.contexts[0].idempotency_key
        # a bounded wait that runs out is a skip too
        assert pgsolo.run_once(other, op, operation, wait=0.3).outcome == "skipped-busy"
        row = row_of(observer, op)
        assert row is not None
        assert row["state"] == "started"
        assert row["holder_pid"] == holder.conn.info.backend_pid
        assert locks_of(observer, other) == set()
    finally:
        assert isinstance(holder.finish(), OnceResult)
    assert calls == []
    assert work_rows(observer, op) == ["holder"]


def test_a_waiter_gets_the_holders_result_without_running(
    db: str, connect: Connect, observer: Any
) -> None:
    op = new_op()
    holder = Holder(connect, op, result={"by": "holder"})
    calls, operation = recorder()
    other = connect()
    waited: list[OnceResult] = []
    waiter = threading.Thread(
        target=lambda: waited.append(pgsolo.run_once(other, op, operation, wait=DEADLINE))
    )
    waiter.start()
    eventually(lambda: observer.waiters(lock_key_for(op)), "the second caller to wait")
    holder.finish()
    waiter.join(DEADLINE)
    assert not waiter.is_alive()
    assert [(w.outcome, w.result, w.attempts) for w in waited] == [
        ("already-succeeded", {"by": "holder"}, 1)
    ]
    assert calls == []
    assert work_rows(observer, op) == ["holder"]


def test_a_holder_whose_session_died_is_taken_over_and_its_late_success_is_refused(
    db: str, connect: Connect, observer: Any
) -> None:
    op = new_op()
    holder = Holder(connect, op)
    # The holder's session ends under it (its host lost the network, an operator killed
    # it): PostgreSQL frees its lock, and its 'started' row is left behind.
    observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (holder.conn.info.backend_pid,))
    eventually(lambda: not observer.holders(lock_key_for(op)), "the holder's lock to go")

    calls, operation = recorder({"by": "taker"})
    taken = pgsolo.run_once(connect(), op, operation)
    assert (taken.outcome, taken.attempts, calls[0].attempt) == ("ran", 2, 2)
    assert calls[0].idempotency_key == holder.contexts[0].idempotency_key

    late = holder.finish()
    assert isinstance(late, psycopg.OperationalError)  # its session is gone
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "succeeded"
    assert row["result"] == {"by": "taker"}
    assert work_rows(observer, op) == ["work"]


def test_a_superseded_attempt_cannot_record_success(
    db: str, connect: Connect, observer: Any
) -> None:
    op = new_op()
    taker_result: list[OnceResult] = []
    _, take_over = recorder({"by": "taker"})

    def losing(ctx: Ctx) -> str:
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'stale')", (op,))
        # The lock goes behind pgsolo's back, another caller takes over and succeeds...
        ctx.conn.execute("SELECT pg_advisory_unlock_all()")
        other = threading.Thread(
            target=lambda: taker_result.append(pgsolo.run_once(connect(), op, take_over))
        )
        other.start()
        other.join(DEADLINE)
        return "stale"  # ... and this attempt comes back too late

    with pytest.raises(LockLostError, match="took the operation over") as raised:
        pgsolo.run_once(connect(), op, losing)
    assert raised.value.reason == "lock-released"
    assert [(r.outcome, r.attempts) for r in taker_result] == [("ran", 2)]
    row = row_of(observer, op)
    assert row is not None
    assert row["result"] == {"by": "taker"}
    assert row["attempts"] == 2
    assert work_rows(observer, op) == ["work"]  # the stale attempt's work rolled back


# -- async ---------------------------------------------------------------------------------


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


async def test_async_skips_a_live_holder_and_rejects_bad_input_first(
    db: str, connect: Connect, aconnect: Any, observer: Any
) -> None:
    op = new_op()
    holder = Holder(connect, op)
    conn = await aconnect()
    ran: list[Any] = []

    async def operation(ctx: Any) -> None:
        ran.append(ctx)

    try:
        assert (await pgsolo.run_once_async(conn, op, operation)).outcome == "skipped-busy"
        with pytest.raises(InvalidOperationKeyError):
            await pgsolo.run_once_async(conn, "", operation)
        with pytest.raises(UsageError):
            await pgsolo.run_once_async(conn, op, operation, wait=-1)
    finally:
        holder.finish()
    assert ran == []
    assert (await pgsolo.run_once_async(conn, op, operation)).outcome == "already-succeeded"


async def test_a_cancelled_async_operation_stays_started_and_releases_its_lock(
    db: str, aconnect: Any, observer: Any
) -> None:
    conn = await aconnect()
    op = new_op()
    running = asyncio.Event()

    async def slow(ctx: Any) -> None:
        await ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, 'lost')", (op,))
        running.set()
        await asyncio.sleep(DEADLINE * 10)

    task = asyncio.create_task(pgsolo.run_once_async(conn, op, slow))
    await asyncio.wait_for(running.wait(), DEADLINE)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "started"
    assert work_rows(observer, op) == []
    assert locks_of(observer, conn) == set()
    assert conn.info.transaction_status == IDLE
