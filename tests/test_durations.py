"""Every duration pgsolo takes is checked when it is given, by one validator
(:func:`pgsolo._types.check_seconds`): a typed :class:`InvalidArgumentError` before any
SQL, never a keeper thread that dies later or a server error once the work holds its lock.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import CLOSED_PORT_DSN, Connect, eventually, terminate
from pgsolo import InvalidArgumentError, Keep, Key
from pgsolo._types import DAY, MAX_PERIOD_SECONDS, check_seconds

NOT_SECONDS = [True, "5", None, [1], math.nan, math.inf, -math.inf, 10**400]


def _short(value: object) -> str:
    return repr(value)[:24]


def _closed(connect: Connect) -> psycopg.Connection[Any]:
    """A connection on which any SQL fails with a driver error, not a UsageError."""
    conn = connect()
    conn.close()
    return conn


# -- the validator ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [*NOT_SECONDS, -1, 0.5, 11, 1e300], ids=_short)
def test_the_validator_refuses_what_is_not_a_duration_in_range(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="the thing") as refused:
        check_seconds("the thing", value, 1, 10)
    if isinstance(value, int | float) and not isinstance(value, bool):
        assert "at least 1 and at most 10 seconds" in str(refused.value)


def test_the_validator_takes_its_bounds_and_an_open_low_end() -> None:
    assert check_seconds("x", 1, 1, 10) == 1.0
    assert check_seconds("x", 10, 1, 10) == 10.0
    assert check_seconds("x", 0.001, 0, 10, above_low=True) == 0.001
    with pytest.raises(InvalidArgumentError, match="more than 0 and at most 2147483 seconds"):
        check_seconds("x", 0, 0, 2_147_483, above_low=True)


# -- Keep ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["interval", "timeout"])
@pytest.mark.parametrize("value", [*NOT_SECONDS, 0, 0.001, 1e10, 1e300, DAY + 1], ids=_short)
def test_keep_refuses_durations_it_cannot_watch_with(field: str, value: Any) -> None:
    """Guards: ``Keep(interval=1e10)`` was accepted and its thread died with an
    OverflowError, leaving the lock unwatched; ``timeout=1e300`` made a held lock look
    lost (keeper-failed). Both bounds are checked at construction."""
    with pytest.raises(InvalidArgumentError, match=field):
        Keep(**{field: value})


def test_keep_at_its_upper_bounds_is_accepted() -> None:
    assert Keep(interval=DAY, timeout=DAY) == Keep(interval=86400, timeout=86400)


def test_a_day_long_beat_timeout_watches_a_held_lock_and_sees_it_go(
    connect: Connect, observer: Any, key: Key
) -> None:
    """Guards the largest timeout the keeper takes: beats with it keep a held lock held
    (no false keeper-failed, as timeout=1e300 gave), and a terminated backend is seen."""
    conn = connect()
    lock = pgsolo.session_lock(conn, key, keep=Keep(interval=0.05, timeout=DAY))
    assert lock.acquire()
    beats: set[object] = set()

    def beaten() -> bool:
        row = observer.conn.execute(
            "SELECT query_start FROM pg_stat_activity WHERE pid = %s AND query LIKE %s",
            (conn.info.backend_pid, "%pg_locks%"),
        ).fetchone()
        if row is not None:
            beats.add(row[0])
        return len(beats) >= 3

    eventually(beaten, "three beats")
    assert not lock.lost, lock.loss
    terminate(observer, conn.info.backend_pid)
    eventually(lambda: lock.lost, "the keeper to see the loss")
    assert lock.loss is not None
    assert lock.loss.reason == "connection-lost"


# -- wait= everywhere ---------------------------------------------------------------------

# math.inf is a wait with no end (test_waits.py); an int too large for a float is no
# spelling of it.
BAD_WAITS = [*NOT_SECONDS[:1], "5", math.nan, -math.inf, 10**400, 0, -1, 1e10]


@pytest.mark.parametrize("wait", BAD_WAITS, ids=_short)
def test_every_wait_is_checked_by_the_one_validator_before_any_sql(
    connect: Connect, key: Key, wait: Any
) -> None:
    """Guards: each entry point that takes ``wait=`` refuses the same values with the
    same typed error, before it touches the (closed) connection or opens one."""
    conn = _closed(connect)
    calls: list[object] = []
    attempts: list[Callable[[], object]] = [
        lambda: pgsolo.xact_lock(conn, key, wait=wait),
        lambda: pgsolo.session_lock(conn, key, wait=wait),
        lambda: pgsolo.run_job(conn, key, calls.append, wait=wait),
        lambda: pgsolo.run_job(CLOSED_PORT_DSN, key, calls.append, wait=wait),
        lambda: pgsolo.run_once(conn, "durations:op", calls.append, wait=wait),
        lambda: pgsolo.singleton(key, dsn=CLOSED_PORT_DSN, wait=wait),
        lambda: pgsolo.Job.define(key, wait=wait),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidArgumentError, match="wait"):
            attempt()
    assert calls == []


@pytest.mark.parametrize("wait", [0, -math.inf, True], ids=_short)
async def test_every_async_wait_is_checked_before_any_sql(
    aconnect: Any, key: Key, wait: Any
) -> None:
    conn = await aconnect()
    await conn.close()
    calls: list[object] = []

    async def fn(*args: object) -> None:
        calls.append(args)

    with pytest.raises(InvalidArgumentError, match="wait"):
        await pgsolo.run_job_async(conn, key, fn, wait=wait)
    with pytest.raises(InvalidArgumentError, match="wait"):
        await pgsolo.run_once_async(conn, "durations:op", fn, wait=wait)
    with pytest.raises(InvalidArgumentError, match="wait"):
        pgsolo.session_lock(conn, key, wait=wait)
    assert calls == []


# -- doctor(older_than=) ------------------------------------------------------------------


@pytest.mark.parametrize("older_than", [*NOT_SECONDS, -1, 1e300, 30 * DAY + 1], ids=_short)
def test_doctor_refuses_an_older_than_it_cannot_compare_before_any_sql(
    connect: Connect, older_than: Any
) -> None:
    with pytest.raises(InvalidArgumentError, match="older_than"):
        pgsolo.doctor(_closed(connect), older_than=older_than)


# -- period="N seconds" -------------------------------------------------------------------


@pytest.mark.parametrize(
    "period",
    [
        "9223372036854775807 seconds",
        "99999999999999999999 seconds",
        f"{MAX_PERIOD_SECONDS + 1} seconds",
        "9" * 5000 + " seconds",
        "0 seconds",
        "-5 seconds",
        "fortnight",
        5,
    ],
    ids=lambda p: repr(p)[:40],
)
def test_a_period_the_server_cannot_hold_is_refused_before_any_sql(
    connect: Connect, key: Key, period: Any
) -> None:
    """Guards: ``period="9223372036854775807 seconds"`` passed validation and failed on
    the server with a raw IntervalFieldOverflow once the lock was held."""
    calls: list[object] = []
    with pytest.raises(InvalidArgumentError, match=str(MAX_PERIOD_SECONDS)):
        pgsolo.run_job(_closed(connect), key, calls.append, period=period)
    with pytest.raises(InvalidArgumentError):
        pgsolo.singleton(key, dsn=CLOSED_PORT_DSN, period=period)
    assert calls == []


def test_the_longest_period_works_on_the_server(db: str) -> None:
    """The bound itself is a period the server takes: the first run completes and
    records it, the second is skipped for the period."""
    job = f"durations-longest-period-{os.getpid()}-{id(db)}"
    period = f"{MAX_PERIOD_SECONDS} seconds"
    first = pgsolo.run_job(db, job, lambda conn: "done", period=period)
    again = pgsolo.run_job(db, job, lambda conn: "done", period=period)
    assert (first.outcome, first.value) == ("completed", "done")
    assert (again.outcome, again.reason) == ("skipped", "already-done-this-period")


def test_cli_once_per_out_of_range_is_a_usage_error_and_runs_nothing(
    db: str, tmp_path: Path
) -> None:
    """Guards: ``--once-per "99999999999999999999 seconds"`` exited 69 ("database
    unavailable") after taking the lock; it is exit 2 before anything connects."""
    marker = tmp_path / "ran"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pgsolo",
            "run",
            "--key",
            f"durations-cli-{os.getpid()}",
            "--once-per",
            "99999999999999999999 seconds",
            "--json",
            "--dsn",
            db,
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w').close()",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert str(MAX_PERIOD_SECONDS) in done.stderr
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert (report["outcome"], report["reason"]) == (None, "usage-error")
    assert not marker.exists()


@pytest.mark.parametrize(
    "arguments",
    [{"pid": 2**31}, {"pid": 2**40}, {"wait_ms": int(DAY * 1000) + 1}, {"wait_ms": 10**20}],
    ids=_short,
)
def test_terminate_backend_refuses_numbers_the_server_cannot_take_before_any_sql(
    connect: Connect, arguments: dict[str, int]
) -> None:
    """Guards: a pid beyond int32 or an enormous wait_ms reached the server and came
    back as a raw "function pg_terminate_backend(bigint, ...) does not exist"."""
    options = {"pid": 12345, **arguments}
    pid = options.pop("pid")
    with pytest.raises(InvalidArgumentError, match="pid" if "pid" in arguments else "wait_ms"):
        pgsolo.terminate_backend(_closed(connect), pid, **options)
