"""hold_elsewhere, lose and losing, in a user's own suite: their job sees ``busy`` while
another session holds its key, and their ``on_lost`` runs when its holder is terminated."""

from __future__ import annotations

import pytest

import pgsolo
from pgsolo.testing import hold_elsewhere, lose

from .conftest import UserSuite

BUSY = """
import pgsolo
from pgsolo.testing import hold_elsewhere


def nightly_report(conn):
    return "sent"


def test_the_report_is_skipped_while_another_host_runs_it(pgsolo_dsn):
    with hold_elsewhere(pgsolo_dsn, "nightly-report") as pid:
        result = pgsolo.run_job(pgsolo_dsn, "nightly-report", nightly_report)
    assert pid > 0
    assert result.outcome == "skipped"
    assert result.reason == "busy"
    assert pgsolo.run_job(pgsolo_dsn, "nightly-report", nightly_report).value == "sent"


def test_a_shared_holder_keeps_a_writer_out(pgsolo_dsn):
    with hold_elsewhere(pgsolo_dsn, "nightly-report", shared=True):
        result = pgsolo.run_job(pgsolo_dsn, "nightly-report", nightly_report)
    assert result.reason == "busy"
"""

LOST = """
import time

import pytest

import pgsolo
from pgsolo.testing import losing


def test_on_lost_runs_when_the_holder_is_terminated(pgsolo_dsn):
    losses = []

    def export(conn):
        deadline = time.monotonic() + 10
        while not losses and time.monotonic() < deadline:  # work until the keeper says so
            time.sleep(0.05)

    keep = pgsolo.Keep(interval=0.1, on_lost=losses.append)
    with (
        losing(pgsolo_dsn, "tenant-export") as terminated,
        pytest.raises(pgsolo.LockLostError) as lost,
    ):
        pgsolo.run_job(pgsolo_dsn, "tenant-export", export, lifetime="session", keep=keep)
    assert lost.value.reason == "connection-lost"
    assert [loss.reason for loss in losses] == ["connection-lost"]
    assert len(terminated) == 1
"""


def test_a_users_job_is_skipped_busy_under_hold_elsewhere(user_suite: UserSuite) -> None:
    user_suite(BUSY).assert_outcomes(passed=2)


def test_a_users_on_lost_runs_under_losing(user_suite: UserSuite) -> None:
    user_suite(LOST).assert_outcomes(passed=1)


def test_lose_says_when_nobody_holds_the_key(dsn: str) -> None:
    """A test that meant to lose a lock its code never took must not pass quietly."""
    with pytest.raises(TimeoutError, match="no session held the key 'never-taken'"):
        lose(dsn, "never-taken", timeout=0.2)


def test_hold_elsewhere_on_a_held_key_raises_at_once(dsn: str) -> None:
    """Two holders of one key cannot both be "elsewhere": the second says so, not waits."""
    with (
        hold_elsewhere(dsn, "held-twice"),
        pytest.raises(pgsolo.LockUnavailableError),
        hold_elsewhere(dsn, "held-twice"),
    ):
        pass
