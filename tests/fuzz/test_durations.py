"""Every duration a user can pass (``wait=``, ``Keep(interval, timeout)``,
``doctor(older_than=)``), fuzzed against a real server: a number in range works (and a wait
leaves ``lock_timeout`` as it was); anything else (NaN, infinities, negatives, huge values,
bools, strings, decimals) is :class:`pgsolo.InvalidArgumentError` before any SQL."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pgsolo
from _support import assert_clean, fuzz, nothing_sent, show_lock_timeout
from pgsolo import Keep, Key

MAX_WAIT = 2_147_483  # lock_timeout is an int of milliseconds
DAY = 86_400
MAX_OLDER_THAN = 30 * DAY

EDGES = [0, -0.0, 5e-324, 0.00999, 0.01, 1, DAY, DAY + 1e-9, MAX_OLDER_THAN, MAX_WAIT]
EDGES += [MAX_WAIT + 1e-6, MAX_WAIT + 1, 2**63, 10**400, -1, -1e-300]
NUMBERS = st.one_of(
    st.integers(),
    st.floats(),
    st.sampled_from(EDGES),
    st.floats(min_value=0, max_value=MAX_WAIT * 1.01),
)
NOT_NUMBERS = st.one_of(
    st.booleans(),
    st.text(st.sampled_from("0123456789.e-+ nainf"), max_size=6),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.just(complex(1, 0)),
    st.binary(max_size=2),
)
SECONDS = st.one_of(NUMBERS, NOT_NUMBERS)


def in_range(value: object, low: float, high: float, *, above_low: bool = False) -> bool:
    """DESIGN §4 restated: a number (never a bool), finite, within the bounds."""
    if isinstance(value, bool | Decimal | Fraction) or not isinstance(value, int | float):
        return False
    seconds = float(value) if abs(value) < 2**1000 else math.inf
    if not math.isfinite(seconds):
        return False
    return (seconds > low if above_low else seconds >= low) and seconds <= high


@fuzz(60)
@given(st.one_of(SECONDS, st.none()), st.sampled_from(["session", "xact"]))
def test_any_wait_locks_and_restores_lock_timeout_or_is_refused_before_any_sql(
    dsn: str, observer: Any, key: Key, wait: Any, lifetime: str
) -> None:
    make = pgsolo.session_lock if lifetime == "session" else pgsolo.xact_lock
    with psycopg.connect(dsn, autocommit=True) as conn:
        before = show_lock_timeout(conn)
        no_end = isinstance(wait, float) and wait == math.inf  # wait=math.inf: no end
        if wait is None or no_end or in_range(wait, 0, MAX_WAIT, above_low=True):
            with make(conn, key, wait=wait) as lock:
                assert lock.acquired
                assert observer.advisory(pid=conn.info.backend_pid) == {key}
        else:
            with nothing_sent(conn, observer), pytest.raises(pgsolo.InvalidArgumentError):
                make(conn, key, wait=wait)
        assert show_lock_timeout(conn) == before
        assert_clean(conn, observer)


@fuzz(40)
@given(SECONDS, SECONDS)
def test_any_keep_watches_the_lock_or_is_refused_before_any_lock(
    dsn: str, observer: Any, key: Key, interval: Any, timeout: Any
) -> None:
    """A keeper with any valid interval and timeout (a day between beats included) stops
    with its lock: nothing is left held, no thread keeps beating."""
    valid = all(in_range(v, 0.01, DAY) for v in (interval, timeout))
    if not valid:
        with pytest.raises(pgsolo.InvalidArgumentError):
            Keep(interval=interval, timeout=timeout)
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pgsolo.session_lock(conn, key, keep=Keep(interval=interval, timeout=timeout)) as lock:
            assert lock.acquired
            assert not lock.lost
        assert not lock.lost
        assert_clean(conn, observer)


@fuzz(40)
@given(SECONDS)
def test_any_older_than_gives_the_checks_or_is_refused_before_any_sql(
    dsn: str, observer: Any, older_than: Any
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if in_range(older_than, 0, MAX_OLDER_THAN):
            checks = pgsolo.doctor(conn, older_than=older_than)
            assert checks
            assert all(isinstance(check, pgsolo.Check) for check in checks)
        else:
            with nothing_sent(conn, observer), pytest.raises(pgsolo.InvalidArgumentError):
                pgsolo.doctor(conn, older_than=older_than)
        assert_clean(conn, observer)
