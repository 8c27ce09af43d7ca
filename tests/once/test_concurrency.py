"""Callers of one operation at once, each on its own connection: a live holder makes the
others skip or wait and never run, a waiter gets the holder's result, a holder whose
session died is taken over and its late success refused; racing callers on fresh keys run
each operation once and leave their connections idle.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    DEADLINE,
    IDLE,
    WORK,
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
    InvalidOperationKeyError,
    LockLostError,
    OnceResult,
    UsageError,
    run_once,
)
from pgsolo.once.operation import (
    lock_key_for,
)


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
    # Its session is gone: pgsolo's own statement (recording success) failed, so the error
    # is pgsolo's, with the driver's as its cause (it was the raw driver error, issue 21).
    assert isinstance(late, LockLostError)
    assert late.reason == "connection-lost"
    assert isinstance(late.__cause__, psycopg.OperationalError)
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


# -- found in review -----------------------------------------------------------------------


def test_a_waiter_that_finds_the_operation_succeeded_leaves_no_transaction_open(
    db: str, connect: Connect
) -> None:
    """B looks (state 'started'), waits for the lock, and gets it after A succeeded:
    once_start then returns no row and B reports already-succeeded. On an autocommit
    connection B's trailing BEGIN is never closed: B is left idle in transaction, so the
    caller's next statements silently run in a transaction that is never committed."""
    op_key = new_op("review2")
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


def test_racing_callers_on_fresh_keys_run_each_once_and_leave_connections_idle(
    db: str, connect: Connect
) -> None:
    """Four connections race for each of 40 operation keys that have no row yet (the first
    call inserts it while the others meet it): each operation must run exactly once, every
    caller that did not skip get its result, and no call leave its connection in a transaction."""
    workers = 4
    keys = [new_op("review2") for _ in range(40)]
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
