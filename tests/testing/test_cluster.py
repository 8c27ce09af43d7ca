"""Replica pairs in a user's own suite: a private primary and standby to stop and promote;
and a PGSOLO_PG_BIN that names no server binaries fails the test with why, never skips."""

from __future__ import annotations

import pytest

from .conftest import UserSuite

FAILOVER = """
import pgsolo


def test_the_job_runs_on_the_promoted_standby(pgsolo_replica_pair):
    pgsolo_replica_pair.stop_primary()
    pgsolo_replica_pair.promote()
    result = pgsolo.run_job(pgsolo_replica_pair.standby_dsn, "export", lambda conn: "ok")
    assert result.value == "ok"
"""


def test_a_users_job_runs_on_a_promoted_standby(user_suite: UserSuite) -> None:
    user_suite(FAILOVER).assert_outcomes(passed=1)


def test_wrong_server_binaries_fail_the_test_with_why(
    user_suite: UserSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGSOLO_PG_BIN", "/nonexistent")
    result = user_suite(FAILOVER)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*SetupError*PGSOLO_PG_BIN='/nonexistent' has no executable*"])
