"""The ledger: each attempt as a row of ``pgsolo.job_runs`` (``record=True``, ``pgsolo run
--record``), written over the attempt's own connection or a spare one, read back by
:func:`history`, with a warning for jobs that mostly skip. Writing it over a spare
connection when the attempt's own is gone is :mod:`pgsolo.jobs._async.record`'s."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .. import sql
from .._logging import jobs_logger as logger
from .._types import read_period
from ..drivers import DriverBase, SyncDriver, adapt_sync
from ..errors import InvalidArgumentError, NotMigratedError
from ..locking import outside_transaction
from ..locking.plans import Plan
from .definition import Job, JobResult, untranslatable_name
from .report import scrubbed

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike

__all__ = [
    "RACE_WINDOW_SECONDS",
    "SKIP_WARNING_WINDOW",
    "Warn",
    "history",
    "history_rows",
    "ledger_statements",
    "log_unrecorded",
    "log_warning",
    "periods",
    "record_plan",
    "skip_warning",
]

Warn = Callable[[str], object]
"""Where a warning about a job's recent attempts goes (the log, or pgsolo run's stderr)."""


def log_warning(text: str) -> None:
    logger.warning("pgsolo: %s", text)


def ledger_statements(
    job: Job, result: JobResult[Any], driver: DriverBase, *, exit_code: int | None = None
) -> list[str]:
    """The statements that write ``result`` to the ledger (``pgsolo.job_runs``)."""
    # Scrubbed like every other text pgsolo stores or logs: a work's exception may quote
    # the connection string it was given, and the ledger is readable by every app role.
    error = (
        None
        if result.error is None
        else scrubbed(f"{type(result.error).__name__}: {result.error}", result.error, driver)
    )
    return outside_transaction(
        driver,
        [
            sql.record_attempt(
                job=job.name,
                lock_key=result.key.text,  # with limit=, the slot held
                outcome=result.outcome,
                reason=result.reason,
                duration_s=result.duration,
                lock_wait_s=result.lock_wait,
                host=socket.gethostname(),
                pid=os.getpid(),
                backend_pid=result.backend_pid,
                application_name=driver.server_info().application_name,
                exit_code=exit_code,
                error=error,
            )
        ],
    )


def log_unrecorded(job: Job, result: JobResult[Any]) -> None:
    logger.error(
        "pgsolo: job %s %s, but its connection is gone and there is no DSN to reconnect"
        " with: the attempt is not recorded in the ledger",
        job.name,
        result.outcome,
    )


def record_plan(
    job: Job,
    result: JobResult[Any],
    driver: DriverBase,
    *,
    exit_code: int | None = None,
    warn: Warn = log_warning,
) -> Plan[None]:
    """Write ``result`` to the ledger (``exit_code``: ``pgsolo run``'s); after a busy
    skip, ``warn`` about a job that mostly skips."""
    try:
        yield ledger_statements(job, result, driver, exit_code=exit_code)
    except Exception as exc:
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NOT_MIGRATED:
            raise NotMigratedError(
                "record=True needs pgsolo's tables: run `pgsolo migrate` first"
            ) from exc
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.NO_PRIVILEGE:
            raise sql.privilege_error(
                f"job {job.name!r} with record=True",
                driver.server_info().user,
                features=("record",),
            ) from exc
        if sql.meaning(driver.sqlstate(exc)) is sql.Meaning.UNTRANSLATABLE:
            raise untranslatable_name(job.name) from exc
        raise
    if result.outcome == "skipped" and result.reason == "busy":
        # Only a skip pays for this look back: ticks of the schedule skipped one after
        # another mean the work is slower than its schedule, which the article says to
        # watch for (skip_warning tells them from hosts racing for one tick).
        try:
            recent = yield outside_transaction(
                driver, [sql.history(job=job.name, limit=_LEDGER_ROWS_READ)]
            )
        except Exception as exc:  # the row is written; a warning must not undo that
            logger.debug("pgsolo: reading the ledger for skip warnings failed: %r", exc)
            return
        for warning in skip_warning(history_rows(recent)):
            warn(warning)


def history(
    conn: SyncConnectionLike, *, job: str | None = None, limit: int = 20
) -> list[dict[str, Any]]:
    """The latest recorded attempts, newest first (``job``: of that job only; ``limit``:
    at most that many). Bad arguments raise :class:`~pgsolo.InvalidArgumentError` before
    any SQL."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _MAX_ROWS:
        raise InvalidArgumentError(
            f"limit must be a whole number from 1 to {_MAX_ROWS}, got {limit!r}"
        )
    _check_job_filter(job)
    driver = adapt_sync(conn)
    statement = sql.history(job=job, limit=limit)
    return history_rows(_read_ledger(driver, statement, "reading the ledger", "history", job))


def periods(conn: SyncConnectionLike, *, job: str | None = None) -> list[dict[str, Any]]:
    """Each job's latest period marked done (``period=``), per period, with when the
    current period and the next begin by the database's clock, and whether the job is
    due (``due``: its current period is not done yet) or when it is next expected
    (``next_expected``: the start of the first period not done)."""
    _check_job_filter(job)
    driver = adapt_sync(conn)
    statement = sql.period_marks(job=job)
    marks = sql.read_json(_read_ledger(driver, statement, "reading the periods", "period", job))
    readable = sorted({mark["period"] for mark in marks if _is_period(mark["period"])})
    bounds = sql.read_json(
        driver.fetch_value(outside_transaction(driver, [sql.period_bounds(readable)]))
    )
    for mark in marks:
        current, following = bounds.get(mark["period"], (None, None))
        done = current is not None and mark["period_start"] == current
        mark.update(
            current_period_start=current,
            next_period_start=following,
            due=current is not None and not done,
            next_expected=following if done else current,
        )
    return list(marks)


_MAX_ROWS = 2**63 - 1  # what LIMIT takes (a bigint)


def _check_job_filter(job: object) -> None:
    """A job name to filter the ledger by: text the database can hold (no NUL), or None."""
    if job is not None and (not isinstance(job, str) or "\0" in job):
        raise InvalidArgumentError(
            f"job must be a job's name (text without NUL) or None, got {job!r}"
        )


def _is_period(text: object) -> bool:
    """A period as pgsolo stores it; anything else in the table is shown, never read."""
    try:
        read_period(text)
    except InvalidArgumentError:
        return False
    return True


def _read_ledger(
    driver: SyncDriver, statement: str, what: str, feature: str, job: str | None
) -> object:
    """The value ``statement`` reads from pgsolo's job tables, outside any transaction;
    a missing table, a missing privilege or a name the database cannot hold as their
    errors of pgsolo's."""
    try:
        return driver.fetch_value(outside_transaction(driver, [statement]))
    except Exception as exc:
        meaning = sql.meaning(driver.sqlstate(exc))
        if meaning is sql.Meaning.NOT_MIGRATED:
            raise NotMigratedError("no ledger: run `pgsolo migrate` first") from exc
        if meaning is sql.Meaning.NO_PRIVILEGE:
            raise sql.privilege_error(what, driver.server_info().user, features=(feature,)) from exc
        if meaning is sql.Meaning.UNTRANSLATABLE:
            raise untranslatable_name(job) from exc
        raise


def history_rows(value: object) -> list[dict[str, Any]]:
    """The rows of :func:`pgsolo.sql.history`'s answer (UTF-8 JSON, whatever the
    connection's client_encoding)."""
    rows = sql.read_json(value)
    return list(rows) if isinstance(rows, list) else []


SKIP_WARNING_WINDOW = 10
"""How many of a job's latest occurrences the skip warning weighs."""

RACE_WINDOW_SECONDS = 30.0
"""Attempts that start within this many seconds of an occurrence's first one belong to it:
hosts racing for one tick of a schedule (clock skew, start-up), not a later tick."""

_LEDGER_ROWS_READ = SKIP_WARNING_WINDOW * 10  # enough for 10 occurrences of ~10 racers

_HELD = ("completed", "failed", "lost")  # attempts that held the lock


def skip_warnings_of(conn: SyncConnectionLike, jobs: Iterable[str]) -> list[str]:
    """The skip warnings of ``jobs``, each weighed on its own recent attempts, as a run of
    it weighs them (not on the rows a listing happens to show)."""
    return [
        warning
        for job in dict.fromkeys(jobs)
        for warning in skip_warning(history(conn, job=job, limit=_LEDGER_ROWS_READ))
    ]


def skip_warning(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Warnings for jobs whose recent occurrences were mostly skipped because the key was
    busy: the work is probably slower than its schedule (the article's advice).

    Racers are no such evidence: with ``record=True`` on N hosts, every tick has one
    attempt that runs and N-1 busy skips. So attempts are grouped into occurrences (those
    that started within :data:`RACE_WINDOW_SECONDS` of the first of them), and an
    occurrence counts as skipped only when none of its attempts held the lock: every
    attempt of that tick found the key still held, by an earlier tick's run or by someone
    else. ``rows``: newest first, as :func:`history` returns them."""
    by_job: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_job.setdefault(str(row["job"]), []).append(row)
    warnings = []
    for job, attempts in by_job.items():
        recent = _occurrences(attempts)[:SKIP_WARNING_WINDOW]
        busy = sum(1 for occurrence in recent if _skipped_busy(occurrence))
        if len(recent) >= 3 and busy * 2 > len(recent):
            warnings.append(
                f"job {job}: {busy} of its last {len(recent)} occurrences were skipped"
                " because an earlier run still held the lock; the work may be slower than"
                " its schedule"
            )
    return warnings


def _occurrences(attempts: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """``attempts`` (newest first) grouped into occurrences, newest first."""
    groups: list[list[Mapping[str, Any]]] = []
    first: datetime | None = None
    for row in sorted(attempts, key=_started):
        started = _started(row)
        if first is None or (started - first).total_seconds() > RACE_WINDOW_SECONDS:
            groups.append([])
            first = started
        groups[-1].append(row)
    return groups[::-1]


def _started(row: Mapping[str, Any]) -> datetime:
    return datetime.fromisoformat(str(row["started_at"]))


def _skipped_busy(occurrence: Sequence[Mapping[str, Any]]) -> bool:
    outcomes = [(r["outcome"], r.get("reason")) for r in occurrence]
    held = any(outcome in _HELD for outcome, _ in outcomes)
    return not held and ("skipped", "busy") in outcomes
