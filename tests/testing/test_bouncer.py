"""PgBouncer in a user's own suite: their xact job runs through a transaction pooler; and
a PGSOLO_PGBOUNCER_BIN that names no program fails their test with why, never skips it
(CI says where PgBouncer is so that its tests run)."""

from __future__ import annotations

import pytest

from .conftest import UserSuite

THROUGH_A_POOLER = """
import pgsolo


def test_the_job_runs_through_pgbouncer(pgsolo_bouncer):
    result = pgsolo.run_job(pgsolo_bouncer.dsn, "export", lambda conn: "exported")
    assert result.value == "exported"
"""


def test_a_users_job_runs_through_pgsolo_bouncer(user_suite: UserSuite) -> None:
    user_suite(THROUGH_A_POOLER).assert_outcomes(passed=1)


def test_a_wrong_pgbouncer_binary_fails_the_test_with_why(
    user_suite: UserSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGSOLO_PGBOUNCER_BIN", "/nonexistent/pgbouncer")
    result = user_suite(THROUGH_A_POOLER)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*SetupError*PGSOLO_PGBOUNCER_BIN='/nonexistent/pgbouncer'*"])
