"""The spellings of a period people write (``daily``, ``24h``, ``1d``, ``86400``) and periods
in a time zone (``timezone="Europe/Paris"``): one parser for the library and the command
line, one recorded spelling per period, and days that start at local midnight, 23 or 25
hours long when the clocks change, by the server's own time zone rules.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

import pgsolo
from _support import new_job, nothing_sent, pgsolo_cli, server_now
from pgsolo import sql
from pgsolo._types import check_period


@pytest.mark.parametrize(
    ("spelling", "timezone", "recorded"),
    [
        ("day", None, "day"),
        ("daily", None, "day"),
        ("hourly", None, "hour"),
        ("annually", None, "year"),
        ("86400", None, "86400 seconds"),
        ("24h", None, "86400 seconds"),
        ("1d", None, "86400 seconds"),
        ("1 day", None, "86400 seconds"),
        ("15m", None, "900 seconds"),
        ("90 minutes", None, "5400 seconds"),
        ("2w", None, "1209600 seconds"),
        ("900 seconds", None, "900 seconds"),
        ("007s", None, "7 seconds"),
        ("daily", "Europe/Paris", "day in Europe/Paris"),
        ("month", "America/New_York", "month in America/New_York"),
        ("day in Europe/Paris", None, "day in Europe/Paris"),
        ("day in Europe/Paris", "Europe/Paris", "day in Europe/Paris"),
        ("daily", "UTC", "day"),
        ("24h", "UTC", "86400 seconds"),
        # Every name tzdata gives UTC: each made a record of its own ("day in Zulu").
        ("daily", "Zulu", "day"),
        ("day in Etc/Universal", None, "day"),
        ("month", "GMT", "month"),
        ("year", "Etc/GMT+0", "year"),
    ],
)
def test_every_spelling_of_a_period_is_recorded_under_one(
    spelling: str, timezone: str | None, recorded: str
) -> None:
    assert check_period(spelling, timezone) == recorded
    assert check_period(recorded) == recorded


@pytest.mark.parametrize(
    ("period", "timezone", "says"),
    [
        ("DAY", None, "a period is"),
        (" day", None, "a period is"),
        ("1 month", None, "a period is"),  # months are calendar periods only
        ("0s", None, "from 1 to"),
        ("101 years", None, "a period is"),
        ("5300w", None, "from 1 to"),
        ("day", "Mars/Olympus", "unknown time zone"),
        ("day", "../../etc/passwd", "IANA name"),
        ("day", " Europe/Paris", "IANA name"),
        ("day", "", "IANA name"),
        ("hour", "Asia/Kolkata", "counted in UTC"),
        ("24h", "Europe/Paris", "use the period 'day'"),
        ("day in Europe/Paris", "Asia/Tokyo", "already in a time zone"),
        # Names PostgreSQL reads as abbreviations first, by each session's
        # timezone_abbreviations: EST was -5 in one session and +10 in another (two
        # records of one day), CET had no summer time.
        ("day", "EST", "has no region"),
        ("day", "CET", "has no region"),
        ("day in MET", None, "has no region"),
        ("week", "Japan", "has no region"),
    ],
)
def test_a_period_or_a_time_zone_it_cannot_be_is_refused_before_any_sql(
    db: str, observer: Any, period: str, timezone: str | None, says: str
) -> None:
    with (
        psycopg.connect(db, autocommit=True) as conn,
        nothing_sent(conn, observer),
        pytest.raises(pgsolo.InvalidArgumentError, match=says),
    ):
        pgsolo.run_job(conn, new_job(), lambda c: "never", period=period, timezone=timezone)
    with pytest.raises(pgsolo.UsageError, match="no period="):
        pgsolo.run_job(db, new_job(), lambda c: "never", timezone="Europe/Paris")


def starts(observer: Any, period: str, instants: list[datetime]) -> list[datetime]:
    """The start of the period of each of ``instants``, as the server computes it."""
    columns = ", ".join(
        sql.period_start(period, at=f"'{instant.isoformat()}'::timestamptz") for instant in instants
    )
    row = observer.conn.execute(f"SELECT {columns}").fetchone()
    return list(row)


PARIS = ZoneInfo("Europe/Paris")
UTC = ZoneInfo("UTC")


@pytest.mark.parametrize(
    ("day", "hours"),
    [
        ("2026-03-28", 24),
        ("2026-03-29", 23),  # clocks go forward at 02:00
        ("2026-10-25", 25),  # clocks go back at 03:00
    ],
)
def test_a_day_in_a_time_zone_runs_from_midnight_to_midnight_there(
    observer: Any, day: str, hours: int
) -> None:
    date = datetime.fromisoformat(day).date()
    midnight = datetime.combine(date, time(0), PARIS).astimezone(UTC)
    following = datetime.combine(date + timedelta(days=1), time(0), PARIS).astimezone(UTC)
    assert following - midnight == timedelta(hours=hours)  # Python's rules agree
    # Every half hour of the local day, its first and last second, and the seconds
    # around it: the server puts each in the day it belongs to there.
    inside = [midnight + timedelta(minutes=30 * n) for n in range(2 * hours)]
    inside.append(following - timedelta(seconds=1))
    found = starts(observer, "day in Europe/Paris", inside)
    assert set(found) == {midnight}
    before, after = starts(
        observer, "day in Europe/Paris", [midnight - timedelta(seconds=1), following]
    )
    assert (following - after, midnight - before) == (timedelta(0), timedelta(hours=24))
    # The same instants without a time zone: UTC days, which start at 00:00 UTC.
    in_utc = set(starts(observer, "day", inside))
    assert len(in_utc) == 2
    assert all(start.timestamp() % 86400 == 0 for start in in_utc)


def test_a_day_whose_midnight_does_not_exist_still_has_one_start(observer: Any) -> None:
    """São Paulo's clocks went from 00:00 to 01:00 on 2018-11-04: that day began at
    01:00 local time (03:00 UTC), lasted 23 hours, and every instant of it has one start."""
    zone = ZoneInfo("America/Sao_Paulo")
    first = datetime(2018, 11, 4, 3, 0, tzinfo=UTC)
    inside = [first + timedelta(minutes=30 * n) for n in range(46)]
    found = set(starts(observer, "day in America/Sao_Paulo", inside))
    assert found == {first}
    assert {i.astimezone(zone).date().isoformat() for i in inside} == {"2018-11-04"}
    (next_day,) = starts(observer, "day in America/Sao_Paulo", [first + timedelta(hours=23)])
    assert next_day == first + timedelta(hours=23)


def test_a_job_once_a_day_in_a_time_zone(db: str, observer: Any) -> None:
    job = new_job("paris-daily")
    first = pgsolo.run_job(db, job, lambda c: "done", period="daily", timezone="Europe/Paris")
    again = pgsolo.run_job(db, job, lambda c: "again", period="day in Europe/Paris")
    utc = pgsolo.run_job(db, job, lambda c: "utc", period="day")
    assert (first.outcome, again.outcome, again.reason) == (
        "completed",
        "skipped",
        "already-done-this-period",
    )
    assert utc.outcome == "completed"  # another period: a UTC day
    rows = observer.conn.execute(
        "SELECT period, period_start FROM pgsolo.job_periods WHERE job = %s ORDER BY period",
        (job,),
    ).fetchall()
    today = server_now(observer).astimezone(PARIS).date()
    midnight = datetime.combine(today, time(0), PARIS).astimezone(UTC)
    assert rows[0] == ("day", rows[0][1])
    assert rows[1] == ("day in Europe/Paris", midnight)


def test_any_spelling_of_daily_finds_the_days_record(db: str) -> None:
    job = new_job("spellings")
    assert pgsolo.run_job(db, job, lambda c: 1, period="daily").completed
    assert pgsolo.run_job(db, job, lambda c: 2, period="day").skipped
    assert pgsolo.run_job(db, job, lambda c: 3, period="24h").completed  # 86400 seconds
    assert pgsolo.run_job(db, job, lambda c: 4, period="1d").skipped
    assert pgsolo.run_job(db, job, lambda c: 5, period="86400").skipped


def test_the_command_line_takes_the_same_spellings_and_a_time_zone(db: str) -> None:
    job = new_job("cli-spellings")
    base = ["run", "--key", job, "--dsn", db]
    assert pgsolo_cli(*base, "--once-per", "24h", "--", "true").returncode == 0
    assert pgsolo_cli(*base, "--once-per", "86400", "--", "true").returncode == 75
    zoned = [*base, "--once-per", "daily", "--timezone", "Europe/Paris", "--", "true"]
    assert pgsolo_cli(*zoned).returncode == 0
    assert pgsolo_cli(*zoned).returncode == 75


@pytest.mark.parametrize(
    "options",
    [
        ["--once-per", "daily", "--timezone", "Mars/Olympus"],
        ["--once-per", "hour", "--timezone", "Europe/Paris"],
        ["--timezone", "Europe/Paris"],
        ["--once-per", "fortnightly"],
    ],
)
def test_the_command_line_refuses_a_period_before_connecting(options: list[str]) -> None:
    nowhere = "host=127.0.0.1 port=1 connect_timeout=2"  # 69 if anything connected
    done = pgsolo_cli("run", "--key", "k", "--dsn", nowhere, *options, "--", "true")
    assert done.returncode == 2, done.stderr


@pytest.mark.parametrize(
    "period",
    ["minute", "hour", "day", "week", "month", "year", "900 seconds", "86400 seconds"]
    + [
        f"{unit} in {zone}"
        for unit in ("day", "week", "month", "year")
        for zone in ("Europe/Paris", "Pacific/Kiritimati", "America/Sao_Paulo")
    ],
)
def test_the_next_period_starts_where_the_current_one_ends(observer: Any, period: str) -> None:
    """What the dashboard's "next expected" reads: for instants on days whose clocks
    change (23- and 25-hour days), at a month's and a year's turn, the next period's start
    is the first instant that the server puts in a period after the current one."""
    instants = [
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 22, 59, tzinfo=UTC),
        datetime(2026, 2, 28, 23, 30, tzinfo=UTC),
        datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC),
        datetime(
            2018, 11, 4, 2, 59, tzinfo=UTC
        ),  # São Paulo: just before a midnight that did not exist
    ]
    at = [f"'{instant.isoformat()}'::timestamptz" for instant in instants]
    columns = ", ".join(
        f"{sql.period_start(period, at=a)}, {sql.next_period_start(period, at=a)}" for a in at
    )
    row = observer.conn.execute(f"SELECT {columns}").fetchone()
    pairs = list(zip(row[0::2], row[1::2], strict=True))
    tick = timedelta(microseconds=1)
    ends = [instant for _, following in pairs for instant in (following - tick, following)]
    assert starts(observer, period, ends) == [
        value for current, following in pairs for value in (current, following)
    ]
    assert all(
        current <= instant < following
        for (current, following), instant in zip(pairs, instants, strict=True)
    )
