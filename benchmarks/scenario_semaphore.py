"""Item 9: a semaphore under contention. 16 threads, each with its own connection, share
a semaphore of 4 slots, a fixed count of attempts each, every attempt waiting for a
slot: acquisitions per second, and overlaps, which THE DATABASE checks.

Inside its slot each worker reads ``clock_timestamp()``, then inserts the interval from
there to ``clock_timestamp()`` under the slot's number into a table whose exclusion
constraint refuses two intervals of one slot that overlap (``benchmarks/intervals.py``):
two holders of one slot, and so a fifth holder, would be refused and counted.

The comparison is the same 16 threads on 4 session locks, each thread given one of the 4
keys for good (``session_lock(conn, key, wait=...)``): 4 at once as well, without the
choice of a slot. A semaphore's waiter waits on one slot at a time, in turns of 0.25 s,
and tries every slot between two turns, so a slot that frees while its waiters wait on
others stays free for up to a turn; with 4 waiters per slot, there is nearly always one
on it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

import pgsolo
from benchmarks.intervals import OVERLAP_ERRORS, interval_table
from benchmarks.registry import Context, Goal, Ratio, Row, scenario

WORKERS = 16
LIMIT = 4
NAME = "pgsolo-bench:exports"
NAMESPACE = 42
FIRST_RESOURCE = 4000  # the static keys (42, 4000) .. (42, 4003)
WAIT_S = 60.0
JOIN_TIMEOUT_S = 300.0
TABLE = "pgsolo_bench_slots"
GOAL = Goal("<=", 1.3)

SETUP = interval_table(TABLE)
START = "SELECT clock_timestamp()"
RECORD = f"INSERT INTO {TABLE} (slot, during) VALUES (%s, tstzrange(%s, clock_timestamp(), '[)'))"

Attempt = Callable[[psycopg.Connection[Any], int], None]


def _work(conn: psycopg.Connection[Any], slot: int) -> str:
    """The section a slot protects: its interval, by the database's clock, in the table."""
    row = conn.execute(START).fetchone()
    assert row is not None
    try:
        conn.execute(RECORD, (slot, row[0]))
    except OVERLAP_ERRORS:
        return "overlap"
    return "completed"


def _semaphore(conn: psycopg.Connection[Any], worker: int) -> str:
    with pgsolo.semaphore(conn, NAME, limit=LIMIT, wait=WAIT_S) as held:
        assert held.slot is not None
        return _work(conn, held.slot)


def _static_keys(conn: psycopg.Connection[Any], worker: int) -> str:
    slot = worker % LIMIT
    with pgsolo.session_lock(conn, (NAMESPACE, FIRST_RESOURCE + slot), wait=WAIT_S):
        return _work(conn, slot)


DESIGNS: dict[str, Callable[[psycopg.Connection[Any], int], str]] = {
    "semaphore": _semaphore,
    "session locks, a key per thread": _static_keys,
}


def _run(conninfo: str, design: str, attempts: int) -> tuple[float, dict[str, int]]:
    """Acquisitions per second of WORKERS threads, ``attempts`` each, and their outcomes."""
    attempt = DESIGNS[design]
    outcomes: dict[str, int] = {}
    guard = threading.Lock()
    failures: list[BaseException] = []
    conns = [psycopg.connect(conninfo, autocommit=True) for _ in range(WORKERS)]
    start = threading.Barrier(WORKERS + 1)

    def worker(me: int) -> None:
        try:
            start.wait()
            for _ in range(attempts):
                outcome = attempt(conns[me], me)
                with guard:
                    outcomes[outcome] = outcomes.get(outcome, 0) + 1
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(me,)) for me in range(WORKERS)]
    try:
        for thread in threads:
            thread.start()
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
        elapsed = time.perf_counter() - began
    finally:
        for conn in conns:
            conn.close()
    if failures:
        raise RuntimeError(f"{design}: {failures[0]!r}")
    return WORKERS * attempts / elapsed, outcomes


@scenario("9", "semaphore: 16 threads on a semaphore of 4, overlaps checked by the database")
def semaphore_contention(ctx: Context) -> list[Row]:
    attempts = ctx.size(60, 8)
    conninfo = ctx.target.conninfo()
    rates: dict[str, list[float]] = {design: [] for design in DESIGNS}
    totals: dict[str, dict[str, int]] = {design: {} for design in DESIGNS}
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(SETUP)
        for round_no in range(ctx.rounds):
            for design in DESIGNS if round_no % 2 == 0 else list(DESIGNS)[::-1]:
                admin.execute(f"TRUNCATE {TABLE}")
                rate, outcomes = _run(conninfo, design, attempts)
                rates[design].append(rate)
                for name, count in outcomes.items():
                    totals[design][name] = totals[design].get(name, 0) + count
        admin.execute(f"DROP TABLE {TABLE}")
    ours, theirs = DESIGNS
    problems = [
        f"{design}: outcomes {outcomes}"
        for design, outcomes in totals.items()
        if set(outcomes) != {"completed"}
    ]
    return [
        Row(
            scenario="9",
            title=f"semaphore ÷ {theirs}, time per acquisition, {WORKERS} threads, {LIMIT} at once",
            # time per acquisition is 1 / rate: ours ÷ theirs = their rate ÷ ours
            ratio=Ratio.paired(rates[theirs], rates[ours]),
            goal=GOAL,
            detail=f"{statistics.median(rates[ours]):,.0f} vs"
            f" {statistics.median(rates[theirs]):,.0f} acquisitions/s; overlaps"
            f" {totals[ours].get('overlap', 0)} and {totals[theirs].get('overlap', 0)}"
            f" of {sum(totals[ours].values())} each",
            problems=problems,
            data={"rates_per_s": rates, "outcomes": totals},
        )
    ]
