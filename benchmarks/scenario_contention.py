"""Item 4: contention. 16 workers (threads, then processes) on 4 keys, a fixed count of
attempts each, every attempt waiting for its key: acquisitions per second, and
overlaps, which THE DATABASE checks.

Inside the locked section each worker reads ``clock_timestamp()``, then inserts the
interval from there to ``clock_timestamp()`` into a table whose exclusion constraint
refuses two intervals of the same key that overlap (``benchmarks/intervals.py``); an
insert that overlaps fails and is counted. A control run without any lock shows that
the check does catch overlaps.

pgsolo (``run_job(..., wait=...)``, a transaction-level job, and the bare
``with xact_lock(conn, key, wait=...)``) is compared with the article's recipe written
by hand with a waiting lock (``BEGIN``; ``pg_advisory_xact_lock``; the work;
``COMMIT``), under the same contention.

Each also has its floor, as in ``paired.py`` (``benchmarks/floor.py``): pgsolo's own
messages sent by hand through psycopg's lowest-cost path (libpq's message, read by
psycopg's generator), with nothing of pgsolo's around them: the wait prepared on the
connection and run by ``EXECUTE`` after the BEGIN, as pgsolo runs it once it ran
``prepare_threshold`` times. For the job, the wait marks its transaction too, and the
marker is checked before the COMMIT. The statements come from :mod:`pgsolo.sql`, so they
stay the ones pgsolo sends. Floor ÷ recipe is what the
messages, psycopg and the server cost under this contention; pgsolo ÷ floor is pgsolo's
own Python, which 16 threads of one interpreter pay for together.
"""

from __future__ import annotations

import multiprocessing
import random
import secrets
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import generators

import pgsolo
from benchmarks.intervals import OVERLAP_ERRORS, interval_table
from benchmarks.registry import Context, Goal, Ratio, Row, scenario
from pgsolo import sql
from pgsolo.keys import as_key

WORKERS = 16
KEYS = 4
NAMESPACE = 42
FIRST_RESOURCE = 3000  # keys (42, 3000) .. (42, 3003)
WARM_SLOT = KEYS  # each worker's warm-up, before the clock: (42, 3004), not counted
WAIT_S = 60.0
JOIN_TIMEOUT_S = 300.0
TABLE = "pgsolo_bench_intervals"

SETUP = interval_table(TABLE)
START = "SELECT clock_timestamp()"
RECORD = f"INSERT INTO {TABLE} (slot, during) VALUES (%s, tstzrange(%s, clock_timestamp(), '[)'))"


def _work(conn: psycopg.Connection[Any], slot: int) -> None:
    """The locked section: its interval, by the database's clock, into the table."""
    row = conn.execute(START).fetchone()
    assert row is not None
    conn.execute(RECORD, (slot, row[0]))


def _with_pgsolo(conn: psycopg.Connection[Any], slot: int) -> str:
    result = pgsolo.run_job(
        conn,
        (NAMESPACE, FIRST_RESOURCE + slot),
        _work,
        slot,
        name=f"bench-contention-{slot}",
        wait=WAIT_S,
        raise_errors=False,
    )
    if result.outcome == "failed" and isinstance(result.error, OVERLAP_ERRORS):
        return "overlap"
    return result.outcome


def _with_xact_lock(conn: psycopg.Connection[Any], slot: int) -> str:
    try:
        with pgsolo.xact_lock(conn, (NAMESPACE, FIRST_RESOURCE + slot), wait=WAIT_S):
            _work(conn, slot)
    except OVERLAP_ERRORS:
        return "overlap"
    return "completed"


def _with_recipe(conn: psycopg.Connection[Any], slot: int) -> str:
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (NAMESPACE, FIRST_RESOURCE + slot))
        _work(conn, slot)
    except OVERLAP_ERRORS:
        conn.execute("ROLLBACK")
        return "overlap"
    conn.execute("COMMIT")
    return "completed"


_ANSWERED = (psycopg.pq.ExecStatus.TUPLES_OK, psycopg.pq.ExecStatus.COMMAND_OK)
_WAIT_SLICE_MS = 2000  # the first slice of a wait of WAIT_S (pgsolo.locking.waits)
_KEYS = [as_key((NAMESPACE, FIRST_RESOURCE + slot)) for slot in range(KEYS + 1)]


def _wait(slot: int, marker: str | None = None) -> sql.WaitCall:
    """The first slice of a wait on ``slot``'s key, as pgsolo builds it (a job's marks its
    transaction too)."""
    wait = sql.xact_wait(_KEYS[slot], _WAIT_SLICE_MS, shared=False, fencing=False, marker=marker)
    if not isinstance(wait, sql.WaitCall):
        raise TypeError(f"not a wait pgsolo prepares: {wait}")
    return wait


# What pgsolo sends once the connection prepared the wait, and the forms a floor's
# connection prepares: one for every slot, and one for a job's.
_EXECUTED = [_wait(slot).executed for slot in range(KEYS + 1)]
_WAIT_FORMS = [_wait(0, marker).prepared for marker in (None, "0" * 16)]


def _send(conn: psycopg.Connection[Any], statements: list[str]) -> None:
    """One simple-query message, as pgsolo sends it on a bare psycopg connection."""
    conn.pgconn.send_query("; ".join(statements).encode("ascii"))
    last = conn.wait(generators.execute(conn.pgconn))[-1]
    if last.status not in _ANSWERED:
        raise RuntimeError(f"the floor's message failed: {last.error_message!r}")


def _floor_xact_lock(conn: psycopg.Connection[Any], slot: int) -> str:
    _send(conn, [sql.BEGIN, _EXECUTED[slot]])
    try:
        _work(conn, slot)
    except OVERLAP_ERRORS:
        _send(conn, [sql.ROLLBACK])
        return "overlap"
    _send(conn, [sql.COMMIT])
    return "completed"


def _floor_run_job(conn: psycopg.Connection[Any], slot: int) -> str:
    marker = secrets.token_hex(8)
    _send(conn, [sql.BEGIN, _wait(slot, marker).executed])
    try:
        _work(conn, slot)
    except OVERLAP_ERRORS:
        _send(conn, [sql.ROLLBACK])
        return "overlap"
    _send(conn, [*sql.same_transaction(marker), sql.COMMIT])
    return "completed"


def _without_lock(conn: psycopg.Connection[Any], slot: int) -> str:
    try:
        _work(conn, slot)
    except OVERLAP_ERRORS:
        return "overlap"
    return "completed"


DESIGNS: dict[str, Callable[[psycopg.Connection[Any], int], str]] = {
    "pgsolo run_job": _with_pgsolo,
    "pgsolo xact_lock": _with_xact_lock,
    "recipe": _with_recipe,
    "floor run_job": _floor_run_job,
    "floor xact_lock": _floor_xact_lock,
    "no lock (control)": _without_lock,
}


@dataclass
class Tally:
    started_ns: int  # time.monotonic_ns(): one clock for every process of the machine
    ended_ns: int
    outcomes: dict[str, int]


def _worker(conninfo: str, design: str, seed: int, attempts: int, barrier: Any) -> Tally:
    attempt = DESIGNS[design]
    rng = random.Random(seed)
    outcomes: dict[str, int] = {}
    with psycopg.connect(conninfo, autocommit=True) as conn:
        if design.startswith("floor"):
            for form in _WAIT_FORMS:  # as pgsolo prepares it, after its first runs
                conn.pgconn.prepare(form.name, form.template)
        # Connected and warm before the clock starts: one attempt on a key of its own,
        # not counted. The clock times acquisitions, not what a process or a connection
        # does once (pgsolo's first lock imports prometheus_client, and its first on a
        # connection checks where it goes).
        attempt(conn, WARM_SLOT)
        barrier.wait(JOIN_TIMEOUT_S)
        started = time.monotonic_ns()
        for _ in range(attempts):
            outcome = attempt(conn, rng.randrange(KEYS))
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return Tally(started, time.monotonic_ns(), outcomes)


def _process_worker(
    conninfo: str, design: str, seed: int, attempts: int, barrier: Any, results: Any
) -> None:
    results.put(_worker(conninfo, design, seed, attempts, barrier))


def _in_threads(conninfo: str, design: str, attempts: int) -> list[Tally]:
    barrier = threading.Barrier(WORKERS)
    tallies: list[Tally] = []
    errors: list[BaseException] = []

    def run(seed: int) -> None:
        try:
            tallies.append(_worker(conninfo, design, seed, attempts, barrier))
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    if errors or len(tallies) != WORKERS:
        raise RuntimeError(f"{design}: {WORKERS - len(tallies)} thread workers failed: {errors!r}")
    return tallies


def _in_processes(conninfo: str, design: str, attempts: int) -> list[Tally]:
    spawn = multiprocessing.get_context("spawn")  # no fork of a process with threads
    barrier = spawn.Barrier(WORKERS)
    results = spawn.Queue()
    procs = [
        spawn.Process(
            target=_process_worker,
            args=(conninfo, design, n, attempts, barrier, results),
            daemon=True,
        )
        for n in range(WORKERS)
    ]
    for p in procs:
        p.start()
    try:
        tallies = [results.get(timeout=JOIN_TIMEOUT_S) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return tallies


def _summary(tallies: list[Tally]) -> tuple[float, dict[str, int]]:
    """Acquisitions per second over the whole run, and the outcomes added up."""
    outcomes: dict[str, int] = {}
    for t in tallies:
        for name, count in t.outcomes.items():
            outcomes[name] = outcomes.get(name, 0) + count
    elapsed = (max(t.ended_ns for t in tallies) - min(t.started_ns for t in tallies)) / 1e9
    return outcomes.get("completed", 0) / elapsed, outcomes


def _count_rows(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE slot < {KEYS}").fetchone()
    return int(row[0]) if row else 0


LOCKED = ["pgsolo run_job", "pgsolo xact_lock", "recipe", "floor run_job", "floor xact_lock"]
_FLOORS = {"pgsolo run_job": "floor run_job", "pgsolo xact_lock": "floor xact_lock"}
# Time per acquisition over the recipe's, 16 threads of one process (the performance
# issue's goals): a job keeps a ledger row, so it may cost more than a bare lock.
THREAD_GOALS = {"pgsolo run_job": Goal("<=", 1.30), "pgsolo xact_lock": Goal("<=", 1.10)}


@scenario("4", "contention: 16 workers on 4 keys, overlaps checked by the database")
def contention(ctx: Context) -> list[Row]:
    # 300 each: with 100, a run of a design took a quarter of a second, and its ratio
    # spread from 0.96 to 1.25 over 5 rounds.
    attempts = ctx.size(300, 10)
    conninfo = ctx.target.conninfo()
    rows = []
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute(SETUP)
        # The control: no lock, so the database must refuse overlapping intervals.
        admin.execute(f"TRUNCATE {TABLE}")
        _, control = _summary(_in_threads(conninfo, "no lock (control)", attempts))
        control_note = (
            f"control without a lock: {control.get('overlap', 0)} overlaps refused of"
            f" {WORKERS * attempts}"
        )
        for kind, run in (("threads", _in_threads), ("processes", _in_processes)):
            rates: dict[str, list[float]] = {name: [] for name in LOCKED}
            totals: dict[str, dict[str, int]] = {name: {} for name in LOCKED}
            recorded = dict.fromkeys(LOCKED, 0)
            for round_no in range(ctx.rounds):
                for design in LOCKED if round_no % 2 == 0 else LOCKED[::-1]:
                    admin.execute(f"TRUNCATE {TABLE}")
                    rate, outcomes = _summary(run(conninfo, design, attempts))
                    rates[design].append(rate)
                    recorded[design] += _count_rows(admin)
                    for name, count in outcomes.items():
                        totals[design][name] = totals[design].get(name, 0) + count
            rows += [
                _row(
                    f"{design} ÷ recipe",
                    f"{WORKERS} {kind}",
                    rates,
                    totals,
                    recorded,
                    design,
                    THREAD_GOALS.get(design) if kind == "threads" else None,
                )
                for design in LOCKED[:2]
            ]
        rows[-1].detail += f"; {control_note}"
        if not control.get("overlap"):
            rows[-1].problems.append("the control saw no overlap: the check proved nothing")
        admin.execute(f"DROP TABLE {TABLE}")
    return rows


def _row(
    title: str,
    workers: str,
    rates: dict[str, list[float]],
    totals: dict[str, dict[str, int]],
    recorded: dict[str, int],
    ours: str,
    goal: Goal | None,
) -> Row:
    floor = _FLOORS[ours]
    problems = []
    for design in (ours, "recipe", floor):
        outcomes = totals[design]
        if outcomes.get("overlap"):
            problems.append(f"{design}: {outcomes['overlap']} overlaps")
        if set(outcomes) - {"completed", "overlap"}:
            problems.append(f"{design}: outcomes {outcomes}")
        if recorded[design] != outcomes.get("completed", 0):
            problems.append(f"{design}: {recorded[design]} intervals recorded for {outcomes}")
    return Row(
        scenario="4",
        title=f"{title}, time per acquisition, {workers} on {KEYS} keys",
        # time per acquisition is 1 / rate: pgsolo's time ÷ the recipe's = their rate ÷ ours
        ratio=Ratio.paired(rates["recipe"], rates[ours]),
        goal=goal,
        detail=f"{statistics.median(rates[ours]):,.0f} vs"
        f" {statistics.median(rates['recipe']):,.0f} acquisitions/s;"
        f" overlaps {totals[ours].get('overlap', 0)} and {totals['recipe'].get('overlap', 0)}"
        f" of {sum(totals[ours].values())} each; pgsolo's messages by hand (the floor)"
        f" ÷ recipe {Ratio.paired(rates['recipe'], rates[floor]).median:.2f},"
        f" pgsolo ÷ floor {Ratio.paired(rates[floor], rates[ours]).median:.2f}",
        problems=problems,
        data={
            "rates_per_s": {d: rates[d] for d in (ours, "recipe", floor)},
            "outcomes": {d: totals[d] for d in (ours, "recipe", floor)},
            "intervals_recorded": {d: recorded[d] for d in (ours, "recipe", floor)},
        },
    )
