"""The article's opening scenario, for real: several workers wake up at the same instant
and race for the daily settlement; pgsolo lets exactly one of them do it.

Each worker is its own process with its own connection (``application_name``
``pgsolo-demo:worker-<i>``). A start barrier releases them together, and each runs the
daily settlement of the article ("Protect a job inside one transaction") under
``pgsolo.xact_lock(conn, "pgsolo-demo:daily-settlement")`` in try mode: the winner locks the pending
rows, marks them processed and keeps its transaction open for ``work_seconds`` so the
others really contend; the others skip as ``busy``. The parent then checks
the table: every row processed, none processed twice.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import TYPE_CHECKING, Any, Literal

from ._logging import configure
from .drivers.connect import open_connection
from .drivers.conninfo import scrub_secrets
from .errors import UsageError
from .locking import session_lock, xact_lock

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "DEMO_LOCK",
    "JOB_KEY",
    "TABLE",
    "DemoResult",
    "WorkerReport",
    "format_report",
    "run_demo",
]

TABLE = "pgsolo_demo_settlements"
JOB_KEY = "pgsolo-demo:daily-settlement"  # never the key of a real job on a shared server
# Held by the parent for a whole run, so two demos on one server take turns instead of
# dropping each other's table and racing for each other's lock.
DEMO_LOCK = "pgsolo-demo"
DEMO_LOCK_WAIT = 60.0
BARRIER_TIMEOUT = 60.0  # how long a connected worker waits for the others
MAX_WORKERS = 64

Status = Literal["completed", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class WorkerReport:
    """What one worker did: ``completed`` (with the rows it processed), ``skipped``
    (with the reason) or ``failed`` (with the error)."""

    worker: int
    status: Status
    reason: str | None = None
    error: str | None = None
    rows: int | None = None
    seconds: float | None = None
    backend_pid: int | None = None
    # The server's clock (epoch seconds) when the worker entered and left the protected
    # block: the lock's promise is that no two of these intervals overlap.
    entered_at: float | None = None
    left_at: float | None = None

    def as_dict(self) -> dict[str, object]:
        """The ``pgsolo demo --json`` vocabulary: ``outcome`` and ``reason`` as in a
        :class:`~pgsolo.JobResult`, ``duration_seconds``."""
        return {
            "worker": self.worker,
            "outcome": self.status,
            "reason": self.reason,
            "error": self.error,
            "rows": self.rows,
            "duration_seconds": self.seconds,
            "backend_pid": self.backend_pid,
        }


@dataclass(frozen=True, slots=True)
class DemoResult:
    workers: list[WorkerReport]
    rows_total: int
    rows_processed: int
    rows_processed_twice: int

    @property
    def winners(self) -> list[WorkerReport]:
        """The workers that processed rows (a worker that got the lock after the winner
        committed also "completes", with nothing left to do)."""
        return [w for w in self.workers if w.status == "completed" and (w.rows or 0) > 0]

    @property
    def overlaps(self) -> list[tuple[int, int]]:
        """Pairs of workers whose protected blocks overlapped (by the server's clock)."""
        ran = [w for w in self.workers if w.status == "completed"]
        return [
            (a.worker, b.worker)
            for i, a in enumerate(ran)
            for b in ran[i + 1 :]
            if (a.entered_at or 0.0) < (b.left_at or 0.0)
            and (b.entered_at or 0.0) < (a.left_at or 0.0)
        ]

    @property
    def problems(self) -> list[str]:
        """Why the run is not the outcome pgsolo promises; empty when it is."""
        found = []
        failed = [w.worker for w in self.workers if w.status == "failed"]
        if failed:
            found.append(f"worker(s) {', '.join(map(str, failed))} failed")
        if self.rows_processed_twice:
            found.append(f"{self.rows_processed_twice} row(s) processed more than once")
        if self.rows_processed != self.rows_total:
            found.append(f"only {self.rows_processed} of {self.rows_total} rows processed")
        if len(self.winners) != 1:
            found.append(f"{len(self.winners)} workers processed rows, expected exactly 1")
        found.extend(
            f"workers {a} and {b} ran the settlement at the same time" for a, b in self.overlaps
        )
        reported = sum(w.rows or 0 for w in self.workers if w.status == "completed")
        if reported != self.rows_processed:
            found.append(f"workers report {reported} rows, the table shows {self.rows_processed}")
        return found

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, object]:
        return {
            "workers": [w.as_dict() for w in self.workers],
            "rows_total": self.rows_total,
            "rows_processed": self.rows_processed,
            "rows_processed_twice": self.rows_processed_twice,
        }


def run_demo(
    dsn: str,
    *,
    workers: int = 4,
    work_seconds: float = 1.5,
    rows: int = 20,
    log_level: int | None = None,
    log_format: str = "text",
) -> DemoResult:
    """Set up the table, race ``workers`` processes for the settlement, check the table."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise UsageError(f"workers must be an int from 1 to {MAX_WORKERS}, got {workers!r}")
    if not 0 <= work_seconds <= 3600:
        raise UsageError(f"work_seconds must be from 0 to 3600, got {work_seconds!r}")
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 1_000_000:
        raise UsageError(f"rows must be an int from 1 to 1000000, got {rows!r}")
    with (
        open_connection(dsn, application_name="pgsolo-demo:setup") as conn,
        session_lock(conn, DEMO_LOCK, wait=DEMO_LOCK_WAIT),
    ):
        _setup(conn, rows)
        reports = _race(
            dsn,
            workers=workers,
            work_seconds=work_seconds,
            log=(log_level, log_format),
        )
        total, processed, twice = _check(conn)
    return DemoResult(reports, total, processed, twice)


def _setup(conn: psycopg.Connection[Any], rows: int) -> None:
    with conn.transaction():
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(
            f"""CREATE TABLE {TABLE} (
                id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                account_id    integer        NOT NULL,
                amount        numeric(12, 2) NOT NULL,
                status        text           NOT NULL DEFAULT 'pending'
                              CHECK (status IN ('pending', 'processed')),
                processed_at  timestamptz,
                processed_by  integer,
                process_count integer        NOT NULL DEFAULT 0
            )"""
        )
        conn.execute(
            f"INSERT INTO {TABLE} (account_id, amount)"
            " SELECT 1000 + g, (g * 7919 %% 100000) / 100.0 FROM generate_series(1, %s) AS g",
            (rows,),
        )


def _check(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    row = conn.execute(
        f"SELECT count(*), count(*) FILTER (WHERE status = 'processed'),"
        f" count(*) FILTER (WHERE process_count > 1) FROM {TABLE}"
    ).fetchone()
    assert row is not None  # noqa: S101 - an aggregate always returns a row
    return int(row[0]), int(row[1]), int(row[2])


def _race(
    dsn: str, *, workers: int, work_seconds: float, log: tuple[int | None, str]
) -> list[WorkerReport]:
    """Start the worker processes, release them together, collect what each did."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    results: Queue[WorkerReport] = ctx.Queue()
    procs = {
        i: ctx.Process(
            target=_worker_main,
            args=(i, dsn, work_seconds, barrier, results, log),
            name=f"pgsolo-demo:worker-{i}",
            daemon=True,
        )
        for i in range(1, workers + 1)
    }
    reports: dict[int, WorkerReport] = {}
    deadline = time.monotonic() + 2 * BARRIER_TIMEOUT + work_seconds
    try:
        for proc in procs.values():
            proc.start()
        while len(reports) < workers and time.monotonic() < deadline:
            try:
                report = results.get(timeout=0.2)
            except queue.Empty:
                silent = [i for i, p in procs.items() if i not in reports and not p.is_alive()]
                if silent:
                    # A worker died without a word: do not let the others wait for it.
                    barrier.abort()
                    _drain(results, reports)
                    if all(not p.is_alive() for p in procs.values()):
                        break
                continue
            reports[report.worker] = report
    finally:
        for proc in procs.values():
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        _drain(results, reports)
        results.close()
    for i, proc in procs.items():
        if i not in reports:
            reports[i] = WorkerReport(
                i, "failed", error=f"the worker process ended without a report ({proc.exitcode=})"
            )
    return [reports[i] for i in sorted(reports)]


def _drain(results: Queue[WorkerReport], reports: dict[int, WorkerReport]) -> None:
    while True:
        try:
            report = results.get(timeout=0.2)
        except queue.Empty:
            return
        reports[report.worker] = report


def _worker_main(
    index: int,
    dsn: str,
    work_seconds: float,
    barrier: Barrier,
    results: Queue[WorkerReport],
    log: tuple[int | None, str],
) -> None:
    """The body of one worker process (spawned: it inherits nothing but its arguments)."""
    configure(*log)  # the parent's level and line format
    try:
        report = _settle(index, dsn, work_seconds, barrier)
    except BaseException as exc:  # reported to the parent, which decides the exit code
        barrier.abort()
        detail = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        report = WorkerReport(index, "failed", error=scrub_secrets(detail, dsn))
    results.put(report)


def _settle(index: int, dsn: str, work_seconds: float, barrier: Barrier) -> WorkerReport:
    """The daily settlement of the article, protected by a transaction-level try lock."""
    with open_connection(dsn, application_name=f"pgsolo-demo:worker-{index}") as conn:
        pid = conn.info.backend_pid
        barrier.wait(timeout=BARRIER_TIMEOUT)  # everyone is connected: go
        started = time.perf_counter()
        with xact_lock(conn, JOB_KEY) as lock:
            if not lock.acquired:
                return WorkerReport(
                    index,
                    "skipped",
                    reason="busy",  # pgsolo.reasons: another worker holds the key
                    seconds=_since(started),
                    backend_pid=pid,
                )
            entered = _server_clock(conn)
            pending = conn.execute(
                f"SELECT id, account_id, amount FROM {TABLE}"
                " WHERE status = 'pending' ORDER BY id FOR UPDATE"
            ).fetchall()
            for row_id, _account_id, _amount in pending:
                conn.execute(
                    f"UPDATE {TABLE} SET status = 'processed', processed_at = now(),"
                    " processed_by = %s, process_count = process_count + 1 WHERE id = %s",
                    (index, row_id),
                )
            # The work takes a while, and the lock is held all along: the others, which
            # asked at the same instant, find it taken.
            time.sleep(work_seconds)
            left = _server_clock(conn)
        # Leaving the block committed the transaction, and that released the lock.
        return WorkerReport(
            index,
            "completed",
            rows=len(pending),
            seconds=_since(started),
            backend_pid=pid,
            entered_at=entered,
            left_at=left,
        )


def _server_clock(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None  # noqa: S101 - a SELECT without FROM returns one row
    return float(row[0])


def _since(started: float) -> float:
    return round(time.perf_counter() - started, 3)


def format_report(result: DemoResult, *, write: Callable[[str], object] = print) -> None:
    """The human-readable report: one line per worker, then the verdict."""
    winners = result.winners
    overlapping = {worker for pair in result.overlaps for worker in pair}
    for w in result.workers:
        if w.status == "completed":
            line = f"worker {w.worker}: completed ({w.rows} rows, {w.seconds:.2f}s)"
            if not w.rows and winners and w.worker not in overlapping:
                line += " - started after the winner had committed: nothing left to do"
        elif w.status == "skipped":
            line = f"worker {w.worker}: skipped: {w.reason}"
        else:
            line = f"worker {w.worker}: failed: {w.error}"
        write(line)
    skipped = sum(w.status == "skipped" for w in result.workers)
    write(
        f"{result.rows_processed} of {result.rows_total} settlements processed,"
        f" {result.rows_processed_twice} processed twice;"
        f" {len(winners)} of {len(result.workers)} workers did the work, {skipped} skipped"
    )
    if result.ok:
        write(f"OK: the daily settlement ran exactly once (see table {TABLE}).")
    else:
        write("FAILED: " + "; ".join(result.problems))
