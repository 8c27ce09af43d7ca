"""``pgsolo doctor``, run for real: its exit code follows the failed checks."""

from __future__ import annotations

import psycopg
from psycopg import sql as pgsql

from _support import json_document
from _support import run_cli as pgsolo


def test_doctor_exit_code_follows_failed_checks(fresh_db: str) -> None:
    done = pgsolo("doctor", "--dsn", fresh_db)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[WARN] public-execute:" in done.stdout  # a warning does not change the code
    assert "[ok  ] idle-timeouts:" in done.stdout
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        admin.execute(
            pgsql.SQL("ALTER DATABASE {} SET idle_session_timeout = '30min'").format(
                pgsql.Identifier(admin.info.dbname)
            )
        )
    done = pgsolo("doctor", "--dsn", fresh_db, "--json")
    assert done.returncode == 1, done.stderr
    report = json_document(done.stdout)
    assert report["exit_code"] == 1
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["idle-timeouts"]
    assert "idle_session_timeout=30m00s" in failed[0]["detail"]
    assert failed[0]["advice"]
