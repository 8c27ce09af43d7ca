"""PgBouncer in a user's own suite: their xact job runs through a transaction pooler (a
wrong PGSOLO_PGBOUNCER_BIN: test_plugin.py)."""

from __future__ import annotations

from .conftest import UserSuite

THROUGH_A_POOLER = """
import pgsolo


def test_the_job_runs_through_pgbouncer(pgsolo_bouncer):
    result = pgsolo.run_job(pgsolo_bouncer.dsn, "export", lambda conn: "exported")
    assert result.value == "exported"
"""


def test_a_users_job_runs_through_pgsolo_bouncer(user_suite: UserSuite) -> None:
    user_suite(THROUGH_A_POOLER).assert_outcomes(passed=1)
