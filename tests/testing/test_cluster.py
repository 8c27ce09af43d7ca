"""Replica pairs in a user's own suite: a private primary and standby to stop and promote
(a wrong PGSOLO_PG_BIN: test_plugin.py)."""

from __future__ import annotations

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
