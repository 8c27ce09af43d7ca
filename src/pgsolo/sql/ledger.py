"""The statements of singleton jobs' own tables: once-per-period records and the ledger of
attempts (both created by ``pgsolo migrate``)."""

from __future__ import annotations

from .._types import read_period
from .text import sql_text, text_or_null, utf8

__all__ = [
    "PERIOD_UNSEEN",
    "history",
    "name_fits",
    "next_period_start",
    "period_bounds",
    "period_done",
    "period_marks",
    "period_record",
    "period_start",
    "record_attempt",
]


def name_fits(job: str) -> str:
    """Fails (SQLSTATE 22P05) when the database's encoding cannot hold a character of the
    job's name, which the ledger and the period records store: asked before the work runs,
    in the round trip that reads the schema's version."""
    return f"SELECT length({sql_text(job)})"


def period_start(period: str, *, at: str = "now()") -> str:
    """The start of the period that holds ``at`` (default: now, by the database's clock,
    never the host's).

    ``period`` is a unit (``minute`` ... ``year``) truncated in UTC or, for a day, week,
    month or year, in its time zone (``day in Europe/Paris``: from local midnight to
    local midnight, 23 or 25 hours when the clocks change), or ``N seconds``
    (``date_bin`` buckets from the Unix epoch).
    """
    read = read_period(period)
    if read.seconds is not None:
        # make_interval, not '{seconds} seconds'::interval: before PostgreSQL 15 an
        # interval's text may not say more than 2^31-1 seconds, and a period may be 100 years.
        return f"date_bin(make_interval(secs => {read.seconds}), {at}, '1970-01-01 00:00:00+00')"
    zone = sql_text(read.zone) if read.zone else "'UTC'"
    return f"date_trunc('{read.unit}', {at}, {zone})"


# A calendar period's length and a half, in interval arithmetic: added to a period's start
# it lands inside the next period whatever the clocks do (a day in a time zone lasts 23 to
# 25 hours; a month from its 1st, local time, is 28 to 31 days), so truncating it finds
# the next period's start.
_INTO_THE_NEXT = {
    "minute": "90 seconds",
    "hour": "90 minutes",
    "day": "36 hours",
    "week": "10 days 12 hours",
    "month": "1 month 15 days",
    "year": "1 year 6 months",
}


def next_period_start(period: str, *, at: str = "now()") -> str:
    """The start of the period after the one that holds ``at`` (default: now, by the
    database's clock)."""
    read = read_period(period)
    current = period_start(period, at=at)
    if read.seconds is not None:
        return f"{current} + make_interval(secs => {read.seconds})"
    return period_start(period, at=f"{current} + interval '{_INTO_THE_NEXT[str(read.unit)]}'")


def period_marks(*, job: str | None) -> str:
    """The latest period marked done of each job and period, as one JSON array
    (:func:`utf8`); the primary key's index serves it."""
    where = f"WHERE job = {sql_text(job)}" if job is not None else ""
    rows = "coalesce(json_agg(m ORDER BY m.job, m.period), '[]'::json)"
    return (
        f"SELECT {utf8(rows)} FROM (SELECT DISTINCT ON (job, period) job, period,"
        " period_start, completed_at, host FROM pgsolo.job_periods"
        f" {where} ORDER BY job, period, period_start DESC) m"
    )


def period_bounds(periods: list[str]) -> str:
    """The current and the next period's start of each of ``periods`` (as stored: read
    by :func:`~pgsolo._types.read_period` first), by the database's clock, as one JSON
    object ``{period: [current, next]}`` (:func:`utf8`)."""
    rows = ", ".join(
        f"({sql_text(period)}, {period_start(period)}, {next_period_start(period)})"
        for period in periods
    )
    if not periods:
        return "SELECT " + utf8("'{}'::json")
    bounds = f"SELECT json_object_agg(p, json_build_array(c, n)) FROM (VALUES {rows}) v(p, c, n)"
    return f"SELECT {utf8(f'({bounds})')}"


PERIOD_UNSEEN = -1
"""What :func:`period_done` answers in a transaction that cannot see the periods recorded
since the lock was granted."""


def period_done(job: str, period: str) -> str:
    """NULL if the current period is done already; otherwise its start, in whole seconds
    since the epoch (every period starts on a whole second): the one a run that finds it
    not done marks (:func:`period_record`) once its work succeeded, in whichever period
    that work ends. :data:`PERIOD_UNSEEN` in a transaction at REPEATABLE READ or
    SERIALIZABLE that began before this statement: its snapshot may be older than the
    lock (a transaction lock's wait takes it as it begins), and a period another run
    recorded while it waited would look undone."""
    start = period_start(period)
    return (
        "SELECT CASE WHEN current_setting('transaction_isolation') <> 'read committed'"
        f" AND statement_timestamp() <> transaction_timestamp() THEN {PERIOD_UNSEEN}"
        " WHEN EXISTS (SELECT 1 FROM pgsolo.job_periods"
        f" WHERE job = {sql_text(job)} AND period = {sql_text(period)}"
        f" AND period_start = {start}) THEN NULL"
        f" ELSE extract(epoch FROM {start})::bigint END"
    )


def period_record(job: str, period: str, start: int, *, host: str, pid: int) -> str:
    """Mark the period that starts at ``start`` (seconds since the epoch, as
    :func:`period_done` read it) done; returns true, or nothing if it was already marked."""
    return (
        "INSERT INTO pgsolo.job_periods (job, period, period_start, host, pid)"
        f" VALUES ({sql_text(job)}, {sql_text(period)}, to_timestamp({int(start)}),"
        f" {sql_text(host)}, {int(pid)})"
        " ON CONFLICT DO NOTHING RETURNING true"
    )


def record_attempt(
    *,
    job: str,
    lock_key: str,
    outcome: str,
    reason: str | None,
    duration_s: float,
    lock_wait_s: float,
    host: str,
    pid: int,
    backend_pid: int | None,
    application_name: str | None,
    exit_code: int | None,
    error: str | None,
) -> str:
    """One ledger row. Times are the database's: finished now, started that many
    seconds earlier by the host's monotonic clock (which never jumps)."""
    elapsed = float(lock_wait_s) + float(duration_s)
    return (
        "INSERT INTO pgsolo.job_runs (job, lock_key, outcome, reason, started_at,"
        " finished_at, duration_ms, lock_wait_ms, host, pid, backend_pid,"
        " application_name, exit_code, error) VALUES ("
        f"{sql_text(job)}, {sql_text(lock_key)}, {sql_text(outcome)},"
        f" {text_or_null(reason)}, clock_timestamp() - make_interval(secs => {elapsed!r}),"
        f" clock_timestamp(), {float(duration_s) * 1000!r}, {float(lock_wait_s) * 1000!r},"
        f" {sql_text(host)}, {int(pid)}, {_int_or_null(backend_pid)},"
        f" {text_or_null(application_name)}, {_int_or_null(exit_code)},"
        f" {text_or_null(error)})"
    )


def history(*, job: str | None, limit: int) -> str:
    """The latest attempts, newest first, as one JSON array (:func:`utf8`)."""
    where = f"WHERE job = {sql_text(job)}" if job is not None else ""
    rows = "coalesce(json_agg(r ORDER BY r.started_at DESC, r.id DESC), '[]'::json)"
    return (
        f"SELECT {utf8(rows)}"
        " FROM (SELECT id, job, lock_key, outcome, reason, started_at, finished_at,"
        " duration_ms, lock_wait_ms, host, pid, backend_pid, application_name,"
        f" exit_code, error FROM pgsolo.job_runs {where}"
        f" ORDER BY started_at DESC, id DESC LIMIT {int(limit)}) r"
    )


def _int_or_null(value: int | None) -> str:
    return "NULL" if value is None else str(int(value))
