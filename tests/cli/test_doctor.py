"""``pgsolo doctor``, run for real: its exit code follows the failed checks."""

from __future__ import annotations

import psycopg
from psycopg import sql as pgsql

import pgsolo as pgsolo_lib
from _support import json_document, unique_name
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


def test_doctor_names_each_leader_and_how_long_it_has_led(db: str) -> None:
    name = unique_name("leader")
    with pgsolo_lib.leader(db, name) as term:
        done = pgsolo("doctor", "--dsn", db, "--json")
        shown = pgsolo("doctor", "--dsn", db)
    assert done.returncode in (0, 1), done.stderr  # other tests' sessions may fail checks
    (leaders,) = [c for c in json_document(done.stdout)["checks"] if c["name"] == "leaders"]
    assert leaders["status"] == "ok"
    assert f"{name!r}: pid {term.backend_pid} ('pgsolo:leader:{name}'" in leaders["detail"]
    assert "leading for " in leaders["detail"]
    assert "at most" not in leaders["detail"]  # from its recorded start
    assert "no candidate waiting" in leaders["detail"]
    assert "[ok  ] leaders: " in shown.stdout
