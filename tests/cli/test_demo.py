"""``pgsolo demo``: the article's scenario with real worker processes on the test server.

Each run is checked against the table itself, not only against what the demo says.

Without ``--dsn`` it runs on an embedded server, whatever the environment says (last test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import psycopg

from _support import Connect, json_document
from _support import run_cli as pgsolo
from pgsolo.demo import JOB_KEY, TABLE, DemoResult, WorkerReport, format_report
from pgsolo.keys import from_name


def demo_command(dsn: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "pgsolo", "demo", "--dsn", dsn, *args]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PGSOLO_DSN", "DATABASE_URL")}


def run_demo(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        demo_command(dsn, *args),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=150,
        check=False,
    )


def table_state(conn: psycopg.Connection) -> tuple[int, int, int, set[int | None]]:
    row = conn.execute(
        f"SELECT count(*), count(*) FILTER (WHERE status = 'processed'),"
        f" coalesce(max(process_count), 0), array_agg(DISTINCT processed_by) FROM {TABLE}"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), set(row[3])


def test_demo_json_one_worker_settles_the_others_skip(dsn: str, connect: Connect) -> None:
    done = run_demo(dsn, "--workers", "3", "--json", "--work-seconds", "1")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json_document(done.stdout)
    assert result["schema"] == "pgsolo.demo/1"
    assert (result["exit_code"], result["rows_total"]) == (0, result["rows_processed"])
    workers = result["workers"]
    assert [w["worker"] for w in workers] == [1, 2, 3]
    completed = [w for w in workers if w["outcome"] == "completed"]
    skipped = [w for w in workers if w["outcome"] == "skipped"]
    assert len(completed) == 1, workers
    assert len(skipped) == 2, workers
    assert all(w["reason"] == "busy" for w in skipped)
    assert completed[0]["rows"] == 20
    assert result["rows_processed"] == 20
    assert result["rows_processed_twice"] == 0
    # Every worker had its own session.
    assert len({w["backend_pid"] for w in workers}) == 3

    # The table agrees: all rows processed, once each, all by the winner.
    total, processed, max_count, by = table_state(connect())
    assert (total, processed, max_count) == (20, 20, 1)
    assert by == {completed[0]["worker"]}


def test_demo_human_output_and_the_lock_is_held_while_working(
    dsn: str, connect: Connect, observer: Any
) -> None:
    key = from_name(JOB_KEY)
    proc = subprocess.Popen(
        demo_command(dsn, "--workers", "2", "--work-seconds", "2", "--rows", "5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        # While the winner works, its own backend holds the lock, under its worker name.
        holders: set[int] = set()
        deadline = time.monotonic() + 60
        while not holders and proc.poll() is None and time.monotonic() < deadline:
            holders = observer.holders(key)
            time.sleep(0.02)
        assert len(holders) == 1
        (pid,) = holders
        row = (
            connect()
            .execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,))
            .fetchone()
        )
        assert row is not None
        assert row[0] in ("pgsolo-demo:worker-1", "pgsolo-demo:worker-2")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out + err
    lines = out.splitlines()
    worker_lines = [line for line in lines if line.startswith("worker ")]
    assert len(worker_lines) == 2
    assert any(line.startswith("worker 1: ") for line in worker_lines)
    assert any(line.startswith("worker 2: ") for line in worker_lines)
    assert sum("completed (5 rows, " in line for line in worker_lines) == 1
    assert sum(line.endswith("skipped: busy") for line in worker_lines) == 1
    assert "5 of 5 settlements processed, 0 processed twice" in out
    assert lines[-1].startswith("OK")
    assert "INFO" not in err  # no library chatter without -v
    assert observer.holders(key) == set()


def test_demo_fails_when_nobody_can_settle(dsn: str, connect: Connect) -> None:
    # Someone else holds the daily settlement: every worker skips, nothing is processed,
    # and the demo says so with a non-zero exit instead of claiming success.
    blocker = connect()
    blocker.execute("SELECT pg_advisory_lock(%s)", (from_name(JOB_KEY).value,))
    try:
        done = run_demo(dsn, "--workers", "2", "--work-seconds", "0")
    finally:
        blocker.execute("SELECT pg_advisory_unlock_all()")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("skipped: busy") == 2
    assert "FAILED" in done.stdout
    assert "0 workers processed rows" in done.stdout
    total, processed, _, _ = table_state(connect())
    assert (total, processed) == (20, 0)


def test_demo_never_contends_with_a_real_job_of_the_same_name(dsn: str, connect: Connect) -> None:
    # A real "daily-settlement" job is running on this server: the demo (run with
    # --dsn on a shared server) must neither block it nor be blocked by it.
    real_job = connect()
    real_job.execute("SELECT pg_advisory_lock(%s)", (from_name("daily-settlement").value,))
    try:
        done = run_demo(dsn, "--workers", "2", "--work-seconds", "0.2", "--json")
    finally:
        real_job.execute("SELECT pg_advisory_unlock_all()")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json_document(done.stdout)
    assert [w["outcome"] for w in report["workers"]].count("completed") == 1


def test_concurrent_demos_take_turns(dsn: str) -> None:
    # Two demos on one server must not drop each other's table or steal each other's
    # settlement lock: each still sees exactly one winner and no double processing.
    procs = [
        subprocess.Popen(
            demo_command(dsn, "--workers", "2", "--work-seconds", "0.5", "--json"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=150)
            outputs.append((proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for returncode, out, err in outputs:
        assert returncode == 0, out + err
        result = json.loads(out)
        assert [w["outcome"] for w in result["workers"]].count("completed") == 1
        assert (result["rows_processed"], result["rows_processed_twice"]) == (20, 0)


# -- the verdict -------------------------------------------------------------------------
# DemoResult's judgement is pure logic over what the workers reported; these cases are the
# ones a live run produces rarely or (without the lock) never.


def report(worker: int, rows: int, entered: float, left: float) -> WorkerReport:
    return WorkerReport(
        worker, "completed", rows=rows, seconds=left - entered, entered_at=entered, left_at=left
    )


def test_verdict_accepts_a_late_worker_that_found_nothing_to_do() -> None:
    # Got the lock after the winner committed: serial, so the promise held.
    result = DemoResult(
        [
            report(1, 20, 100.0, 101.5),
            report(2, 0, 101.6, 101.7),
            WorkerReport(3, "skipped", reason="busy"),
        ],
        rows_total=20,
        rows_processed=20,
        rows_processed_twice=0,
    )
    assert result.ok, result.problems
    lines: list[str] = []
    format_report(result, write=lines.append)
    assert (
        "worker 2: completed (0 rows, 0.10s) - started after the winner had committed" in (lines[1])
    )
    assert lines[-1].startswith("OK")


def test_verdict_rejects_workers_that_ran_at_the_same_time() -> None:
    # What the demo looks like without the advisory lock: FOR UPDATE makes the others
    # queue behind the winner's row locks, so no row is processed twice, yet they all ran.
    result = DemoResult(
        [report(1, 20, 100.0, 101.5), report(2, 0, 100.0, 103.0), report(3, 0, 100.1, 104.5)],
        rows_total=20,
        rows_processed=20,
        rows_processed_twice=0,
    )
    assert not result.ok
    assert result.overlaps == [(1, 2), (1, 3), (2, 3)]
    lines: list[str] = []
    format_report(result, write=lines.append)
    assert lines[-1].startswith("FAILED: workers 1 and 2 ran the settlement at the same time")


def test_verdict_rejects_double_processing_and_missing_rows() -> None:
    result = DemoResult(
        [report(1, 15, 100.0, 101.0), report(2, 10, 102.0, 103.0)],
        rows_total=20,
        rows_processed=18,
        rows_processed_twice=5,
    )
    assert set(result.problems) == {
        "5 row(s) processed more than once",
        "only 18 of 20 rows processed",
        "2 workers processed rows, expected exactly 1",
        "workers report 25 rows, the table shows 18",
    }


# -- the environment -----------------------------------------------------------------------


def test_demo_default_ignores_the_environment(tmp_path: object) -> None:
    # PGSOLO_DSN names a server that does not exist; the demo must not even look at it.
    # The embedded server cannot be created under /proc, which proves that is what it tried.
    done = pgsolo(
        "demo",
        "--json",
        env={
            "PGSOLO_DSN": "postgresql://nobody:hunter2@127.0.0.1:1/nope",
            "DATABASE_URL": "postgresql://nobody:hunter2@127.0.0.1:1/nope",
            "XDG_DATA_HOME": "/proc/pgsolo-no-such-dir",
        },
    )
    assert done.returncode == 69, done.stderr
    assert "embedded server" in done.stderr
    assert "127.0.0.1" not in done.stderr + done.stdout
    error = json_document(done.stdout)  # --json: the failure is a document too
    assert (error["exit_code"], error["error"]["code"]) == (69, "database-unavailable")
