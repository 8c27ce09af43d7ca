"""Every ``period=`` a user can pass to a job, fuzzed against a real server: a unit (or its
adjective, in a time zone for a day or more) or a number of seconds the server can hold
(``900``, ``"900 seconds"``, ``15m``, ``24h``, ``1d``) runs the job once per period; anything
else is :class:`pgsolo.InvalidArgumentError` before any SQL (not a server error once the
work has its lock)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import pgsolo
from _support import HOSTILE_TEXT, assert_clean, fuzz, new_job, nothing_sent

UNITS = ["minute", "hour", "day", "week", "month", "year"]
ADJECTIVES = ["minutely", "hourly", "daily", "weekly", "monthly", "yearly", "annually"]
ZONED_UNITS = ["day", "week", "month", "year", "daily", "weekly", "monthly", "yearly", "annually"]
ZONES = [
    "Europe/Paris",
    "UTC",
    "America/Argentina/Buenos_Aires",
    "Nowhere/Atlantis",
    "europe/paris",
]
MAX_SECONDS = 100 * 365 * 86_400
SECONDS_PER = {
    **dict.fromkeys(["s", "second", "seconds"], 1),
    **dict.fromkeys(["m", "min", "minute", "minutes"], 60),
    **dict.fromkeys(["h", "hour", "hours"], 3_600),
    **dict.fromkeys(["d", "day", "days"], 86_400),
    **dict.fromkeys(["w", "week", "weeks"], 604_800),
}

NUMBERS_OF_SECONDS = st.one_of(
    st.integers(-5, 10**12).map(str),
    st.sampled_from(["0", "00", "007", "1", str(MAX_SECONDS), str(MAX_SECONDS + 1), "9" * 40]),
    st.sampled_from(
        ["+5", "-5", "5.5", "1e3", "\uff15", "\u00b2", "\u0663", "0x10", "5_000", " 5", ""]
    ),
)
SPELLINGS = st.sampled_from(
    ["seconds", "second", "Seconds", " seconds", "seconds ", "secs", "s", "m", "h", "d", "w"]
)
MORE_SPELLINGS = st.sampled_from(["min", "days", "hours", "months", "year", "mo", "D"])
PERIODS = st.one_of(
    st.sampled_from(UNITS + ADJECTIVES),
    st.builds(
        lambda unit, sep, zone: f"{unit}{sep}{zone}",
        st.sampled_from(UNITS + ADJECTIVES),
        st.sampled_from([" in ", " in  ", "@"]),
        st.sampled_from(ZONES),
    ),
    st.sampled_from(UNITS).map(str.upper),
    st.sampled_from(UNITS).map(lambda unit: unit + "s"),
    st.sampled_from(UNITS).map(lambda unit: f" {unit}"),
    st.builds(
        lambda n, s, sep: f"{n}{sep}{s}",
        NUMBERS_OF_SECONDS,
        st.one_of(SPELLINGS, MORE_SPELLINGS),
        st.sampled_from([" ", "  ", "\t", "\u00a0", ""]),
    ),
    HOSTILE_TEXT,
    st.one_of(st.integers(), st.floats(), st.booleans(), st.binary(max_size=4)),
)


def valid_period(period: object) -> bool:
    """README's periods restated: a unit or its adjective (a day or more in an IANA time
    zone, with " in "), or ASCII digits N, then a unit of fixed length (none: seconds;
    short right after N, long after one blank), N times that unit from 1 to 100 years."""
    if period is None or period in UNITS + ADJECTIVES:
        return True
    if not isinstance(period, str):
        return False
    zoned = re.fullmatch(r"([a-z]+) in (.+)", period)
    if zoned is not None:
        unit, zone = zoned.groups()
        if zone == "UTC":  # UTC's periods, whatever the unit
            return unit in UNITS + ADJECTIVES
        return unit in ZONED_UNITS and zone in ZONES[:3]
    found = re.fullmatch(r"([0-9]+)(s|m|min|h|d|w| [a-z]+)?", period, re.ASCII)
    per = SECONDS_PER.get((found.group(2) or "s").lstrip(" ")) if found else None
    return found is not None and per is not None and 1 <= int(found.group(1)) * per <= MAX_SECONDS


@fuzz(50)
@given(st.one_of(PERIODS, st.none()))
@example("minute in UTC")
@example("hour in Europe/Paris")
@example("3 months")
def test_any_period_runs_the_job_once_per_period_or_is_refused_before_any_sql(
    db: str, observer: Any, period: Any
) -> None:
    job = new_job("fuzz-period")
    with psycopg.connect(db, autocommit=True) as conn:
        if valid_period(period):
            first = pgsolo.run_job(conn, job, lambda c: "done", period=period)
            again = pgsolo.run_job(conn, job, lambda c: "again", period=period)
            assert (first.outcome, first.value) == ("completed", "done")
            recorded = observer.conn.execute(
                "SELECT count(DISTINCT period_start), count(*) FROM pgsolo.job_periods"
                " WHERE job = %s",
                (job,),
            ).fetchone()
            if period is None:
                assert (again.outcome, recorded) == ("completed", (0, 0))
            elif again.completed:  # a short period ended between the two runs
                assert recorded == (2, 2)
            else:
                assert (again.outcome, again.reason) == ("skipped", "already-done-this-period")
                assert recorded == (1, 1)
        else:
            with nothing_sent(conn, observer), pytest.raises(pgsolo.InvalidArgumentError):
                pgsolo.run_job(conn, job, lambda c: "never", period=period)
        assert_clean(conn, observer)
