"""The ledger (``record=True``), the tests only the sync flavour has: a lost attempt on a
caller's connection is logged as unrecorded, the warning for jobs that mostly skip, and
ledger reads that leave the caller's connection idle. The ledger tests alike in both
flavours are written once, async, in ``_async/test_ledger.py``; scripts/unasync.py
generates ``_sync/test_ledger.py``.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    IDLE,
    Connect,
    a_schedule_tick_passes,
    hold,
    new_job,
    terminate,
    unhold,
)
from pgsolo.jobs import run_job
from pgsolo.jobs.record import periods, skip_warning
from pgsolo.schema import LATEST_VERSION, schema_version


def test_a_lost_attempt_on_a_callers_connection_is_logged_as_unrecorded(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job = new_job()
    conn = connect()

    def fn(c: psycopg.Connection) -> None:
        terminate(observer, c.info.backend_pid)

    with caplog.at_level(logging.INFO, logger="pgsolo"):
        result = run_job(conn, job, fn, lifetime="session", record=True, raise_errors=False)

    assert result.outcome == "lost"
    assert pgsolo.history(observer.conn, job=job) == []
    assert any(
        "not recorded" in r.getMessage() and job in r.getMessage() and r.levelno == logging.ERROR
        for r in caplog.records
    )


def test_skip_warning_flags_jobs_that_are_mostly_busy(
    db: str, connect: Connect, observer: Any
) -> None:
    slow, healthy, periodic = new_job(), new_job(), new_job()
    assert run_job(db, slow, lambda c: None, record=True).completed
    holder = hold(connect, slow)
    for _ in range(4):  # four ticks of its schedule, all while a run still holds it
        a_schedule_tick_passes(observer.conn, slow)
        assert run_job(db, slow, lambda c: None, record=True).reason == "busy"
    unhold(holder, slow)
    for _ in range(3):
        a_schedule_tick_passes(observer.conn, healthy)
        assert run_job(db, healthy, lambda c: None, record=True).completed
    for _ in range(4):  # once a day, tried often: skips, but not because it is slow
        run_job(db, periodic, lambda c: None, record=True, period="day")

    rows = [*pgsolo.history(observer.conn, job=slow), *pgsolo.history(observer.conn, job=healthy)]
    warnings = skip_warning(rows)
    assert len(warnings) == 1
    assert slow in warnings[0]
    assert "4 of its last 5 occurrences" in warnings[0]
    assert skip_warning(pgsolo.history(observer.conn, job=healthy)) == []
    periodic_rows = pgsolo.history(observer.conn, job=periodic)
    assert [r["reason"] for r in periodic_rows].count("already-done-this-period") == 3
    assert skip_warning(periodic_rows) == []


def test_a_recorded_busy_skip_warns_when_the_job_mostly_skips(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    slow = new_job()
    assert run_job(db, slow, lambda c: None, record=True).completed
    holder = hold(connect, slow)
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        for _ in range(3):  # one tick of its schedule after another
            a_schedule_tick_passes(observer.conn, slow)
            assert run_job(db, slow, lambda c: None, record=True).reason == "busy"
    unhold(holder, slow)
    warnings = [
        r.getMessage() for r in caplog.records if "slower than its schedule" in r.getMessage()
    ]
    # 1 of 2 occurrences skipped is not "mostly"; 2 of 3 and 3 of 4 are.
    assert len(warnings) == 2
    assert all(slow in w for w in warnings)
    assert "3 of its last 4" in warnings[-1]


def test_hosts_racing_for_one_tick_are_no_sign_of_slow_work(
    db: str, connect: Connect, observer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """`record=True` on 4 hosts: each tick one runs and three skip, busy. Those skips are
    racers of one occurrence, not the work falling behind its schedule, and no loser may
    warn, not even while this tick's winner still runs (its row not written yet); a tick
    every attempt of which skipped is."""
    job = new_job()
    with caplog.at_level(logging.WARNING, logger="pgsolo"):
        for _ in range(4):
            a_schedule_tick_passes(observer.conn, job)
            holder = hold(connect, job)  # this tick's winner, running
            for _ in range(3):
                assert run_job(db, job, lambda c: None, record=True).reason == "busy"
            unhold(holder, job)
            assert run_job(db, job, lambda c: None, record=True).completed  # its row
    rows = pgsolo.history(observer.conn, job=job)
    assert len(rows) == 16
    assert skip_warning(rows) == []
    assert not [r for r in caplog.records if "slower than its schedule" in r.getMessage()]
    holder = hold(connect, job)  # a run that still holds it, tick after tick
    for _ in range(5):
        a_schedule_tick_passes(observer.conn, job)
        for _ in range(3):
            assert run_job(db, job, lambda c: None, record=True).reason == "busy"
    unhold(holder, job)
    [warning] = skip_warning(pgsolo.history(observer.conn, job=job, limit=100))
    assert f"job {job}: 5 of its last 9 occurrences were skipped" in warning
    assert "slower than its schedule" in warning


def test_ledger_reads_leave_a_non_autocommit_connection_idle(
    db: str, connect: Connect, observer: Any
) -> None:
    """schema_version() and history() must not leave the caller "idle in transaction"."""
    job = new_job()
    assert run_job(db, job, lambda c: "ok", record=True).completed
    conn = connect(autocommit=False)
    pid = conn.info.backend_pid

    assert schema_version(conn) == LATEST_VERSION
    assert conn.info.transaction_status == IDLE
    rows = pgsolo.history(conn, job=job)
    assert [r["outcome"] for r in rows] == ["completed"]
    assert conn.info.transaction_status == IDLE
    row = observer.conn.execute(
        "SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    assert row == ("idle",)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 2**63}, "limit"),  # sent, the server refused it as out of range
        ({"limit": True}, "limit"),
        ({"job": 5}, "job"),
        ({"job": "a\0b"}, "job"),  # a bare ValueError of pgsolo's SQL text
    ],
)
def test_history_refuses_bad_arguments_before_any_sql(
    observer: Any, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(pgsolo.InvalidArgumentError, match=match):
        pgsolo.history(observer.conn, **options)
    with pytest.raises(pgsolo.InvalidArgumentError, match="job"):
        periods(observer.conn, job=object())  # type: ignore[arg-type]
