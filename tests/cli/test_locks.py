"""``pgsolo locks``, ``pgsolo doctor`` and ``pgsolo terminate``, run for real in subprocesses.

The locks are held by other real sessions; what the commands print is checked against
them, and what ``terminate`` does is checked on the server (``pg_locks`` through the
observer session). The confirmation prompt is answered through a real pseudo-terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import sql as pgsql

from _support import DEADLINE, eventually
from _support import run_cli as pgsolo
from pgsolo.keys import Key, derive_int64

Connect = Callable[..., psycopg.Connection]


def alive(observer: object, pid: int) -> bool:
    row = observer.conn.execute(  # type: ignore[attr-defined]
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row == (1,)


# -- pgsolo locks ------------------------------------------------------------------------


def test_locks_table_and_json_with_names_and_the_wait_chain(
    fresh_db: str, tmp_path: Path, observer: object
) -> None:
    registry = tmp_path / "locks.toml"
    registry.write_text("[locks]\nnightly-report = [42, -1001]\n", encoding="utf-8")
    a = psycopg.connect(fresh_db, autocommit=True, application_name="worker-a")
    b = psycopg.connect(fresh_db, autocommit=True, application_name="worker-b")
    c = psycopg.connect(fresh_db, autocommit=True, application_name="worker-c")
    settle = derive_int64("daily-settlement")
    a.execute(f"SELECT pg_advisory_lock(42, -1001), pg_advisory_lock({settle})")
    b.execute("SET statement_timeout = 60000")
    c.execute("SET statement_timeout = 60000")
    b.execute("SELECT pg_advisory_lock(-5)")
    threads = [
        threading.Thread(target=_quietly, args=(b, "SELECT pg_advisory_lock(42, -1001)")),
        threading.Thread(target=_quietly, args=(c, "SELECT pg_advisory_lock_shared(-5)")),
    ]
    threads[0].start()
    eventually(lambda: observer.waiters(Key((42, -1001))), "b to wait")  # type: ignore[attr-defined]
    threads[1].start()
    eventually(lambda: observer.waiters(Key(-5)), "c to wait")  # type: ignore[attr-defined]
    pa, pb, pc = (conn.info.backend_pid for conn in (a, b, c))
    try:
        args = (
            "locks",
            "--dsn",
            fresh_db,
            "--registry",
            str(registry),
            "--name",
            "daily-settlement",
        )
        done = pgsolo(*args)
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("3 held, 2 waiting: advisory locks in ")
        header = lines[1].split()
        assert header[:5] == ["KEY", "NAME", "MODE", "LIFETIME", "STATUS"]
        rows = [line.split() for line in lines[2:7]]
        # int64 keys in numeric order, then pairs; holders before waiters.
        assert rows[0][:5] == [str(settle), "daily-settlement", "exclusive", "session", "held"]
        assert [r[:4] for r in rows[1:3]] == [  # no name: that column is empty
            ["-5", "exclusive", "?", "held"],
            ["-5", "shared", "?", "waiting"],
        ]
        assert rows[3][:5] == ["42:-1001", "nightly-report", "exclusive", "session", "held"]
        assert rows[4][:5] == ["42:-1001", "nightly-report", "exclusive", "?", "waiting"]
        assert "worker-a" in lines[2]
        assert "worker-b" in lines[6]
        assert lines[-1].split() == [str(pc), "->", str(pb), "->", str(pa)]

        data = json.loads(pgsolo(*args, "--json").stdout)
        assert data["wait_chains"] == [[pc, pb, pa]]
        waiting = [lock for lock in data["locks"] if not lock["granted"]]
        assert [(w["key"], w["pid"], w["blocked_by"], w["mode"]) for w in waiting] == [
            ("-5", pc, [pb], "shared"),
            ("42:-1001", pb, [pa], "exclusive"),
        ]
        assert all(w["since_source"] == "waitstart" for w in waiting)

        only = json.loads(pgsolo(*args, "--key", "nightly-report", "--json").stdout)["locks"]
        assert [(lock["key"], lock["pid"]) for lock in only] == [("42:-1001", pa), ("42:-1001", pb)]
    finally:
        for conn in (a, b, c):
            conn.close()
        for thread in threads:
            thread.join(DEADLINE)


def _quietly(conn: psycopg.Connection, statement: str) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute(statement)


def test_locks_in_an_empty_database_and_bad_arguments(fresh_db: str, tmp_path: Path) -> None:
    done = pgsolo("locks", "--dsn", fresh_db)
    assert (done.returncode, done.stdout.splitlines()[0][:19]) == (0, "0 held, 0 waiting: ")
    bad = tmp_path / "bad.toml"
    bad.write_text("[locks]\nx = 'not a key'\n", encoding="utf-8")
    for args in (
        ["--registry", str(bad)],
        ["--registry", str(tmp_path / "missing.toml")],
        ["--key", "1:99999999999"],
        ["--name", ""],
    ):
        done = pgsolo("locks", "--dsn", fresh_db, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("pgsolo locks: error: "), done.stderr


# -- pgsolo doctor -----------------------------------------------------------------------


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
    report = json.loads(done.stdout)
    assert report["exit_code"] == 1
    failed = [c for c in report["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["idle-timeouts"]
    assert "idle_session_timeout=30m00s" in failed[0]["detail"]
    assert failed[0]["advice"]


# -- pgsolo terminate --------------------------------------------------------------------


def _holder(dsn: str, key: Key) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True, application_name="to-terminate")
    conn.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    return conn


def terminate_on_a_terminal(answer: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``pgsolo terminate ARGS`` with a real pseudo-terminal as stdin, answering."""
    primary, secondary = pty.openpty()
    try:
        os.write(primary, answer.encode() + b"\n")
        base = {k: v for k, v in os.environ.items() if k not in ("PGSOLO_DSN", "DATABASE_URL")}
        return subprocess.run(
            [sys.executable, "-m", "pgsolo", "terminate", *args],
            stdin=secondary,
            capture_output=True,
            text=True,
            env=base,
            timeout=120,
            check=False,
        )
    finally:
        os.close(primary)
        os.close(secondary)


def test_terminate_shows_asks_and_releases(dsn: str, key: Key, observer: object) -> None:
    holder = _holder(dsn, key)
    pid = holder.info.backend_pid
    try:
        done = pgsolo("terminate", str(pid), "--dsn", dsn)  # stdin is not a terminal
        assert done.returncode == 2
        assert "pass --yes" in done.stderr
        assert key.text in done.stdout
        assert "to-terminate" in done.stdout
        assert observer.holders(key) == {pid}  # type: ignore[attr-defined]

        done = terminate_on_a_terminal("n", str(pid), "--dsn", dsn)
        assert done.returncode == 1, done.stderr
        assert "[y/N]" in done.stderr
        assert f"not terminated: pid {pid}" in done.stdout
        assert observer.holders(key) == {pid}  # type: ignore[attr-defined]

        done = terminate_on_a_terminal("y", str(pid), "--dsn", dsn)
        assert done.returncode == 0, done.stderr
        assert f"terminated pid {pid}: 1 advisory lock(s) released" in done.stdout
        assert observer.holders(key) == set()  # type: ignore[attr-defined]
        assert not alive(observer, pid)
    finally:
        holder.close()


def test_terminate_yes_for_scripts(dsn: str, key: Key, observer: object) -> None:
    holder = _holder(dsn, key)
    try:
        done = pgsolo("terminate", str(holder.info.backend_pid), "--yes", "--dsn", dsn)
        assert done.returncode == 0, done.stderr
        assert observer.holders(key) == set()  # type: ignore[attr-defined]
    finally:
        holder.close()


def test_terminate_refuses_a_pid_without_advisory_locks(dsn: str, observer: object) -> None:
    with psycopg.connect(dsn, autocommit=True) as bystander:
        pid = bystander.info.backend_pid
        done = pgsolo("terminate", str(pid), "--yes", "--dsn", dsn)
        assert done.returncode == 2
        assert "holds no advisory lock" in done.stderr
        assert alive(observer, pid)
        done = pgsolo("terminate", str(pid), "--yes", "--force", "--dsn", dsn)
        assert done.returncode == 0, done.stderr
        eventually(lambda: not alive(observer, pid), "the bystander to be gone")


@pytest.mark.parametrize("pid", ["0", "-3", "abc"])
def test_terminate_bad_pid_is_a_usage_error(pid: str) -> None:
    assert pgsolo("terminate", pid, "--yes", "--dsn", "host=/nonexistent").returncode == 2
