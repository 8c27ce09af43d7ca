"""Every ``period=`` a user can pass to a job, fuzzed against a real server: a unit or
``"N seconds"`` the server can hold runs the job once per period; anything else is
:class:`pgsolo.InvalidArgumentError` before any SQL (not a server error once the work has
its lock)."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pgsolo
from _support import HOSTILE_TEXT, assert_clean, fuzz, new_job, nothing_sent

UNITS = ["minute", "hour", "day", "week", "month", "year"]
MAX_SECONDS = 100 * 365 * 86_400

NUMBERS_OF_SECONDS = st.one_of(
    st.integers(-5, 10**12).map(str),
    st.sampled_from(["0", "00", "007", "1", str(MAX_SECONDS), str(MAX_SECONDS + 1), "9" * 40]),
    st.sampled_from(
        ["+5", "-5", "5.5", "1e3", "\uff15", "\u00b2", "\u0663", "0x10", "5_000", " 5", ""]
    ),
)
SPELLINGS = st.sampled_from(["seconds", "second", "Seconds", " seconds", "seconds ", "secs"])
PERIODS = st.one_of(
    st.sampled_from(UNITS),
    st.sampled_from(UNITS).map(str.upper),
    st.sampled_from(UNITS).map(lambda unit: unit + "s"),
    st.sampled_from(UNITS).map(lambda unit: f" {unit}"),
    st.builds(
        lambda n, s, sep: f"{n}{sep}{s}",
        NUMBERS_OF_SECONDS,
        SPELLINGS,
        st.sampled_from([" ", "  ", "\t", "\u00a0", ""]),
    ),
    HOSTILE_TEXT,
    st.one_of(st.integers(), st.floats(), st.booleans(), st.binary(max_size=4)),
)


def valid_period(period: object) -> bool:
    """DESIGN §4 restated: a unit, or ASCII digits N from 1 to 100 years, then " seconds"."""
    if period is None or period in UNITS:
        return True
    if not isinstance(period, str):
        return False
    found = re.fullmatch(r"([0-9]+) seconds", period)
    return found is not None and 1 <= int(found.group(1)) <= MAX_SECONDS


@fuzz(50)
@given(st.one_of(PERIODS, st.none()))
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
