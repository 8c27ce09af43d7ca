"""Edge cases of operation keys (pgsolo.once), found in review; each is a regression
test on a real server."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from pgsolo import OperationContext, run_once, run_once_async

Connect = Callable[..., psycopg.Connection]
Ctx = OperationContext[psycopg.Connection]
IDLE = psycopg.pq.TransactionStatus.IDLE


def new_op() -> str:
    return f"review2:{uuid.uuid4().hex[:16]}"


def test_a_waiter_that_finds_the_operation_succeeded_leaves_no_transaction_open(
    db: str, connect: Connect
) -> None:
    """B looks (state 'started'), waits for the lock, and gets it after A succeeded:
    once_start then returns no row and B reports already-succeeded. On an autocommit
    connection B's trailing BEGIN is never closed: B is left idle in transaction, so the
    caller's next statements silently run in a transaction that is never committed."""
    op_key = new_op()
    a_conn, b_conn = connect(), connect()
    running, finish = threading.Event(), threading.Event()
    results: dict[str, Any] = {}

    def slow(ctx: Ctx) -> str:
        running.set()
        assert finish.wait(10)
        return "charged"

    def run_a() -> None:
        results["a"] = run_once(a_conn, op_key, slow)

    def run_b() -> None:
        results["b"] = run_once(b_conn, op_key, lambda ctx: "ran twice", wait=10)

    a = threading.Thread(target=run_a)
    a.start()
    assert running.wait(10)
    b = threading.Thread(target=run_b)
    b.start()
    # B is waiting for the lock (it read 'started' before A finished).
    watcher = connect()
    for _ in range(200):
        waiting = watcher.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND pid = %s",
            (b_conn.info.backend_pid,),
        ).fetchone()
        if waiting and waiting[0]:
            break
        threading.Event().wait(0.05)
    finish.set()
    a.join(10)
    b.join(10)
    assert results["a"].outcome == "ran"
    assert results["b"].outcome == "already-succeeded"
    assert results["b"].result == "charged"
    assert b_conn.info.transaction_status == IDLE, (
        f"B left {b_conn.info.transaction_status.name} after already-succeeded"
    )


def test_an_autocommit_off_operation_without_database_work_does_not_warn(
    db: str, connect: Connect, caplog: pytest.LogCaptureFixture
) -> None:
    """On an autocommit=False connection, an operation that does no database work makes
    pgsolo warn that it 'ended its own transaction: its database work committed apart
    from the record of its success' - which is false: there was no work and no commit."""
    conn = connect(autocommit=False)
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        result = run_once(conn, new_op(), lambda ctx: 1)
    assert result.outcome == "ran"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warnings, warnings


@pytest.mark.parametrize("value", [1e16, 1e300, -0.0, 1.0])
def test_a_stored_float_reads_back_as_the_same_type(
    db: str, connect: Connect, value: float
) -> None:
    """'ran' returns json.loads(stored) (a float); 'already-succeeded' returns what jsonb
    gave back, which prints 1e16 as 10000000000000000 (an int in Python). The same
    operation's result then changes type between the first call and every later one."""
    conn = connect()
    op_key = new_op()
    first = run_once(conn, op_key, lambda ctx: {"amount": value})
    again = run_once(conn, op_key, lambda ctx: None)
    assert again.outcome == "already-succeeded"
    assert type(again.result["amount"]) is type(first.result["amount"]), (
        first.result,
        again.result,
    )
    assert again.result == first.result


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
    op_key = new_op()

    def operation(ctx: Ctx) -> None:
        raise Unprintable

    with pytest.raises(Unprintable):
        run_once(conn, op_key, operation)
    assert conn.info.transaction_status == IDLE, conn.info.transaction_status.name


@pytest.mark.parametrize(
    ("wide", "count", "tail"), [("é", 250, ""), ("€", 166, "ab"), ("😀", 125, "")]
)
def test_op_keys_at_exactly_the_byte_limit_run(
    db: str, connect: Connect, wide: str, count: int, tail: str
) -> None:
    op_key = uuid.uuid4().hex[:12] + wide * count + tail  # unique per run, 512 bytes
    assert len(op_key.encode()) == 512
    conn = connect()
    assert run_once(conn, op_key, lambda ctx: [2**70, "ü", {"k": None}]).outcome in (
        "ran",
        "already-succeeded",
    )
    again = run_once(conn, op_key, lambda ctx: None)
    assert again.result == [2**70, "ü", {"k": None}]


async def test_cancelled_while_starting_the_attempt_leaves_nothing_behind(
    db: str, aconnect: Any, observer: Any
) -> None:
    """Cancel the task while once_start waits on the operation's row (held FOR UPDATE by
    another session): the connection must be idle, its lock released, the row as before."""

    op_key = new_op()
    conn = await aconnect()

    async def failing(ctx: Any) -> None:
        raise ValueError("first attempt fails")

    with pytest.raises(ValueError, match="first attempt fails"):
        await run_once_async(conn, op_key, failing)
    observer.conn.execute("BEGIN")
    observer.conn.execute("SELECT 1 FROM pgsolo.operations WHERE op_key = %s FOR UPDATE", (op_key,))
    ran: list[int] = []

    async def operation(ctx: Any) -> int:
        ran.append(1)
        return 1

    task = asyncio.create_task(run_once_async(conn, op_key, operation))
    try:
        for _ in range(200):
            blocked = observer.conn.execute(
                "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted",
                (conn.info.backend_pid,),
            ).fetchone()
            if blocked and blocked[0]:
                break
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 20)
    finally:
        observer.conn.execute("ROLLBACK")
    assert not ran
    assert conn.info.transaction_status == IDLE, conn.info.transaction_status.name
    assert observer.advisory(pid=conn.info.backend_pid) == set()
    row = observer.conn.execute(
        "SELECT state, attempts FROM pgsolo.operations WHERE op_key = %s", (op_key,)
    ).fetchone()
    assert row == ("failed", 1)


def test_the_connections_password_is_not_stored_in_the_error(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The server's own password when it asks for one (CI's PostgreSQL 15); otherwise
    # (trust authentication) one with quotes, backslashes and spaces, which it accepts.
    secret = connect().info.password or "pw with 'quote\\ and space"
    conn = connect(password=secret)
    op_key = new_op()

    def operation(ctx: Ctx) -> None:
        raise ValueError(f"login failed for {secret}!")

    with (
        caplog.at_level(logging.ERROR, logger="pgsolo"),
        pytest.raises(ValueError, match="login failed"),
    ):
        run_once(conn, op_key, operation)
    (error,) = observer.conn.execute(
        "SELECT error FROM pgsolo.operations WHERE op_key = %s", (op_key,)
    ).fetchone()
    assert "login failed" in error
    assert secret not in error, error
    assert secret not in caplog.text


def test_racing_callers_on_fresh_keys_run_each_once_and_leave_connections_idle(
    db: str, connect: Connect
) -> None:
    workers = 4
    keys = [new_op() for _ in range(40)]
    conns = [connect() for _ in range(workers)]
    runs: dict[str, int] = dict.fromkeys(keys, 0)
    guard = threading.Lock()
    outcomes: list[tuple[str, str, Any]] = []
    barrier = threading.Barrier(workers)
    left_open: list[str] = []

    def worker(conn: psycopg.Connection) -> None:
        for op_key in keys:
            barrier.wait(10)

            def op(ctx: Ctx, op_key: str = op_key) -> str:
                with guard:
                    runs[op_key] += 1
                return "ok"

            result = run_once(conn, op_key, op)
            with guard:
                outcomes.append((op_key, result.outcome, result.result))
            if conn.info.transaction_status != IDLE:
                left_open.append(f"{op_key}: {result.outcome}")
                conn.rollback()

    threads = [threading.Thread(target=worker, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(count == 1 for count in runs.values()), runs
    assert all(r == "ok" for _, o, r in outcomes if o != "skipped-busy")
    assert not left_open, left_open
