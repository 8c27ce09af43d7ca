"""``--json``: one vocabulary for every command, each document valid against the JSON
Schema its ``schema`` field names, failures included (issue 15, item 3)."""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from _support import (
    MARK,
    eventually,
    json_document,
    pgsolo_cli,
    pgsolo_in_background,
    run_args,
    script,
)
from pgsolo import Key
from pgsolo.keys import leader_key

CLOSED = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"


def test_every_command_prints_one_schema_valid_document(
    migrated: str, key: Key, job: str, tmp_path: Path
) -> None:
    run = pgsolo_cli(
        *run_args(key.text, migrated, job=job), "--record", "--json", "--",
        *script(MARK, tmp_path, 0),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json_document(run.stderr)
    assert report["schema"] == "pgsolo.run/1"
    assert (report["outcome"], report["key"], report["error"]) == ("completed", key.text, None)
    assert isinstance(report["database"], str)  # a name, never a connection string

    history = json_document(pgsolo_cli("history", "--dsn", migrated, "--job", job, "--json").stdout)
    assert (history["database"], history["server"]) == (report["database"], report["server"])
    (attempt,) = history["attempts"]
    assert (attempt["key"], attempt["outcome"]) == (key.text, "completed")
    # seconds, not milliseconds: the same unit as the row's own timestamps and the run's report
    span = datetime.fromisoformat(attempt["finished_at"]) - datetime.fromisoformat(
        attempt["started_at"]
    )
    assert 0 <= attempt["duration_seconds"] <= span.total_seconds() + 0.001
    assert attempt["duration_seconds"] == pytest.approx(report["duration_seconds"], abs=0.01)

    for args in (
        ("migrate", "--dsn", migrated),
        ("doctor", "--dsn", migrated),
        ("locks", "--dsn", migrated),
        ("prune", "--dsn", migrated, "--older-than", "36500d", "--dry-run"),
        ("key", "daily-settlement"),
    ):
        done = pgsolo_cli(*args, "--json")
        doc = json_document(done.stdout)
        assert doc["schema"] == f"pgsolo.{args[0]}/1"
        if "--dsn" in args:
            # one meaning per name: the database's name, and the server as host:port
            # (the same as pgsolo run's), never a label or a connection string
            assert (doc["database"], doc["server"]) == (report["database"], report["server"])


def test_terminate_json_reports_what_it_released(dsn: str, key: Key) -> None:
    with psycopg.connect(dsn, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        pid = holder.info.backend_pid
        done = pgsolo_cli("terminate", str(pid), "--yes", "--dsn", dsn, "--json")
        assert done.returncode == 0, done.stderr
        doc = json_document(done.stdout)
        assert (doc["pid"], doc["terminated"], doc["locks_left"]) == (pid, True, 0)
        assert [lock["key"] for lock in doc["locks"]] == [key.text]


def test_failures_are_json_documents_with_the_same_exit_codes(
    fresh_db: str, key: Key, tmp_path: Path
) -> None:
    unavailable = pgsolo_cli("locks", "--dsn", CLOSED, "--json")
    assert unavailable.returncode == 69
    error = json_document(unavailable.stdout)
    assert error["schema"] == "pgsolo.error/1"
    assert (error["command"], error["exit_code"]) == ("locks", 69)
    assert error["error"]["code"] == "database-unavailable"

    not_migrated = pgsolo_cli("history", "--dsn", fresh_db, "--json")
    assert not_migrated.returncode == 2
    assert json_document(not_migrated.stdout)["error"]["code"] == "not-migrated"

    usage = pgsolo_cli("terminate", "1", "--yes", "--dsn", fresh_db, "--json")  # holds nothing
    assert usage.returncode == 2
    assert json_document(usage.stdout)["error"]["code"] == "usage-error"

    run = pgsolo_cli(*run_args(key.text, CLOSED), "--json", "--", *script(MARK, tmp_path, 0))
    assert run.returncode == 69
    report = json_document(run.stderr)
    assert report["outcome"] is None
    assert report["error"]["code"] == "database-unavailable"


def test_terminate_json_of_a_leader_is_valid(migrated: str, observer: Any) -> None:
    """Regression: terminate.json copied the lock row of locks.json, without the
    ``term_start`` a leader's row has (``since_source``), so terminating a leader printed
    a document its own schema refused. It refers to locks.json's row now."""
    name = f"json-{uuid.uuid4().hex[:8]}"
    key = leader_key(name)
    with pgsolo_in_background("run", "--leader", name, "--dsn", migrated, "--", "sleep", "60"):
        (pid,) = eventually(lambda: observer.holders(key), "the leader to lead")
        done = pgsolo_cli("terminate", str(pid), "--yes", "--dsn", migrated, "--json")
        assert done.returncode == 0, done.stderr
        doc = json_document(done.stdout)
        assert [lock["since_source"] for lock in doc["locks"]] == ["term_start"]
