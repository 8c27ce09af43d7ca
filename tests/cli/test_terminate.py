"""``pgsolo terminate``, run for real: it shows, asks (through a real pseudo-terminal) and
releases; ``--yes`` for scripts; it refuses a pid that holds no advisory lock (one that
only waits included) and a bad pid.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys

import psycopg
import pytest

from _support import (
    DEADLINE,
    STATEMENT_BOUND_20S,
    Connect,
    MakeRole,
    eventually,
    in_background,
    role_dsn,
    run_cli,
)
from _support import run_cli as pgsolo
from pgsolo.keys import Key


def alive(observer: object, pid: int) -> bool:
    row = observer.conn.execute(  # type: ignore[attr-defined]
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row == (1,)


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


# -- found in review -----------------------------------------------------------------------


def test_terminate_refuses_a_pid_that_only_waits_and_never_claims_it_released_locks(
    connect: Connect, observer: object, dsn: str
) -> None:
    """Issue 5: terminate "refuses pids that hold no advisory lock unless --force". A
    backend that only waits holds none, yet it is terminated without --force and the
    command reports "1 advisory lock(s) released"."""
    k = Key((7_200_002, 1))
    holder, waiter = connect(), connect(options=STATEMENT_BOUND_20S)
    holder.execute(f"SELECT pg_advisory_lock({k.sql_args})")
    thread = in_background(waiter, f"SELECT pg_advisory_lock({k.sql_args})")
    eventually(lambda: observer.waiters(k), "the waiter to wait")  # type: ignore[attr-defined]
    pid = waiter.info.backend_pid
    try:
        done = run_cli("terminate", str(pid), "--yes", "--dsn", dsn)
        assert "released" not in done.stdout, done.stdout
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    finally:
        observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # type: ignore[attr-defined]
        thread.join(DEADLINE)


def test_a_holder_that_lets_go_while_terminate_asks_is_not_terminated(
    dsn: str, key: Key, observer: object
) -> None:
    """Regression: what the pid held was read before the question, and the answer
    terminated it though it had let go of its lock meanwhile, and printed "1 advisory
    lock(s) released". The termination asks again in its own statement."""
    holder = _holder(dsn, key)
    pid = holder.info.backend_pid
    primary, secondary = pty.openpty()
    try:
        asking = subprocess.Popen(
            [sys.executable, "-m", "pgsolo", "terminate", str(pid), "--dsn", dsn],
            stdin=secondary,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert asking.stderr is not None
        asked = ""
        while "[y/N]" not in asked:
            chunk = asking.stderr.read(1)
            assert chunk, f"terminate ended without asking: {asked!r}"
            asked += chunk
        holder.execute(f"SELECT pg_advisory_unlock({key.sql_args})")
        os.write(primary, b"y\n")
        out, err = asking.communicate(timeout=DEADLINE)
        assert asking.returncode == 2, (out, err)
        assert "let go of its advisory locks before it was terminated" in err
        assert "released" not in out
        assert alive(observer, pid)
        assert holder.execute("SELECT 1").fetchone() == (1,)
    finally:
        os.close(primary)
        os.close(secondary)
        holder.close()


def test_terminate_says_a_hidden_client_is_hidden_not_local(
    fresh_db: str, key: Key, make_role: MakeRole
) -> None:
    """Regression: a session of another role, whose address the server hides from a role
    without pg_read_all_stats, was shown as "client local"."""
    holder = _holder(fresh_db, key)  # the test's superuser
    role, _ = make_role()
    try:
        done = pgsolo("terminate", str(holder.info.backend_pid), "--dsn", role_dsn(fresh_db, role))
        assert "client hidden, state hidden" in done.stdout, done.stdout
        assert "local" not in done.stdout
    finally:
        holder.close()
