"""``pgsolo history`` and the ledger rows ``pgsolo run --record`` writes for it: one row per
attempt, newest first, the warning for jobs that mostly skip, and "run pgsolo migrate
first" before the ledger exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _support import (
    MARK,
    Connect,
    a_schedule_tick_passes,
    json_document,
    ledger,
    pgsolo_cli,
    raw_lock_sql,
    run_args,
    script,
)
from pgsolo.keys import Key


def test_record_writes_one_row_per_attempt_and_history_shows_them(
    migrated: str, connect: Connect, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    base = (*run_args(key.text, migrated, job=job), "--record")
    assert pgsolo_cli(*base, "--", *script(MARK, tmp_path, 0)).returncode == 0
    assert pgsolo_cli(*base, "--", *script(MARK, tmp_path, 2)).returncode == 2
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    assert pgsolo_cli(*base, "--", *script(MARK, tmp_path, 0)).returncode == 75
    psql.execute("SELECT pg_advisory_unlock_all()")

    rows = ledger(observer.conn, job)
    assert [(r["outcome"], r["reason"], r["exit_code"]) for r in rows] == [
        ("completed", None, 0),
        ("failed", None, 2),
        ("skipped", "busy", 75),
    ]
    assert {r["application_name"] for r in rows} == {f"pgsolo:{job}"}
    assert {r["lock_key"] for r in rows} == {key.text}
    assert all(r["ordered"] for r in rows)

    history = pgsolo_cli("history", "--dsn", migrated, "--job", job, "--json")
    assert history.returncode == 0, history.stderr
    shown = json_document(history.stdout)["attempts"]
    assert [(r["outcome"], r["exit_code"]) for r in shown] == [
        ("skipped", 75),
        ("failed", 2),
        ("completed", 0),
    ]  # newest first
    assert {r["job"] for r in shown} == {job}
    assert {"started_at", "finished_at", "duration_seconds", "host", "pid"} <= set(shown[0])

    table = pgsolo_cli("history", "--dsn", migrated, "--job", job, "--limit", "2")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["started_at", "job", "outcome", "reason"]
    assert len(lines) == 3
    assert "skipped" in lines[1]
    assert "busy" in lines[1]
    assert "failed" in lines[2]
    other = pgsolo_cli("history", "--dsn", migrated, "--job", f"{job}-nobody")
    assert (other.returncode, other.stdout.strip()) == (
        0,
        f"no attempts recorded for job {job}-nobody",
    )


def test_mostly_skipped_attempts_bring_a_warning(
    migrated: str, connect: Connect, key: Key, job: str, tmp_path: Path
) -> None:
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    base = (*run_args(key.text, migrated, job=job), "--record")
    skips = []
    for _ in range(3):  # one tick of its schedule after another, all while it is held
        a_schedule_tick_passes(psql, job)
        skips.append(pgsolo_cli(*base, "--", *script(MARK, tmp_path, 0)))
    psql.execute("SELECT pg_advisory_unlock_all()")
    assert [s.returncode for s in skips] == [75, 75, 75]
    assert "slower than its schedule" not in skips[0].stderr  # one skip is no pattern
    assert f"pgsolo run: warning: job {job}: 3 of its last 3 occurrences" in skips[2].stderr
    history = pgsolo_cli("history", "--dsn", migrated, "--job", job)
    assert history.returncode == 0
    warnings = [line for line in history.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1
    assert "slower than its schedule" in warnings[0]
    assert job in warnings[0]
    # Weighed on the job's own attempts, as a run weighs them, not on the rows shown:
    # with --limit 2 it said "2 of its last 2", where the run had said "3 of its last 3".
    shown = pgsolo_cli("history", "--dsn", migrated, "--job", job, "--limit", "2")
    assert f"warning: job {job}: 3 of its last 3 occurrences" in shown.stderr


def test_without_migrate_ledger_features_say_run_migrate_first(
    fresh_db: str, key: Key, tmp_path: Path
) -> None:
    history = pgsolo_cli("history", "--dsn", fresh_db)
    assert history.returncode == 2
    assert "run pgsolo migrate first" in history.stderr
    for option in (["--record"], ["--once-per", "day"]):
        done = pgsolo_cli(*run_args(key.text, fresh_db), *option, "--", *script(MARK, tmp_path, 0))
        assert done.returncode == 2, done.stderr
        assert "run pgsolo migrate first" in done.stderr
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "ran").exists()  # nothing ran without its ledger
