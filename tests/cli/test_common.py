"""What every command shares: usage errors exit 2, ``--version`` and ``--help``, exit codes
from ``main()``, how the database is chosen (``--dsn``, ``PGSOLO_DSN``, ``DATABASE_URL``),
and a password that is never printed, whatever the spelling of the connection string.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from _support import run_cli as pgsolo
from pgsolo.cli import main
from pgsolo.dsn import EMBEDDED, choose_dsn


@pytest.mark.parametrize(
    "args",
    [[], ["key"], ["key", "job", "--namespace", "x"], ["nope"], ["demo", "--workers", "0"]],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    done = pgsolo(*args)
    assert done.returncode == 2
    assert "usage: pgsolo" in done.stderr


def test_version_and_help() -> None:
    version = pgsolo("--version")
    assert (version.returncode, version.stdout.split()[0]) == (0, "pgsolo")
    helped = pgsolo("--help")
    assert helped.returncode == 0
    assert "demo" in helped.stdout
    assert "key" in helped.stdout


def test_main_returns_exit_codes_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["key", "daily-settlement", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["key"] == "-2533923874772390729"
    assert main(["key", ""]) == 2
    assert "must not be empty" in capsys.readouterr().err
    assert main([]) == 2


def test_connection_resolution_order() -> None:
    env = {"PGSOLO_DSN": "host=a", "DATABASE_URL": "host=b"}
    assert choose_dsn("host=c", environ=env).dsn == "host=c"
    assert choose_dsn(None, environ=env).dsn == "host=a"
    assert choose_dsn(None, environ={"PGSOLO_DSN": "", "DATABASE_URL": "host=b"}).dsn == "host=b"
    libpq = choose_dsn(None, environ={})
    assert (libpq.dsn, libpq.source) == ("", "libpq defaults")
    # The demo's default replaces the environment: it never picks up a production URL.
    demo = choose_dsn(None, environ=env, default=EMBEDDED)
    assert demo.embedded
    assert choose_dsn("host=c", environ=env, default=EMBEDDED).dsn == "host=c"
    assert choose_dsn("embedded", environ={}).embedded


def test_unreachable_server_exits_69_without_the_password() -> None:
    done = pgsolo("demo", "--dsn", "postgresql://alice:hunter2@127.0.0.1:1/db", "--json")
    assert done.returncode == 69
    assert "database unavailable" in done.stderr
    assert "alice:***@127.0.0.1:1/db" in done.stderr
    assert "hunter2" not in done.stderr + done.stdout


def test_invalid_dsn_is_a_usage_error_that_hides_the_password() -> None:
    # libpq would answer 'missing "=" after "ret"': half of the password.
    done = pgsolo("demo", "--dsn", "host=localhost password=sec ret")
    assert done.returncode == 2
    assert "invalid connection string" in done.stderr
    assert "sec ret" not in done.stderr
    assert '"ret"' not in done.stderr


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql+psycopg2://app:Hunter2pw@db/app",  # SQLAlchemy's spelling of DATABASE_URL
        "POSTGRESQL://app:Hunter2pw@db/app",
        " postgresql://app:Hunter2pw@db/app",
        "host=db password='Hunter2pw",
    ],
)
@pytest.mark.parametrize("via", ["--dsn", "DATABASE_URL"])
def test_no_spelling_of_an_invalid_dsn_shows_its_password(dsn: str, via: str) -> None:
    args = ["migrate", "--dsn", dsn] if via == "--dsn" else ["migrate"]
    env = {**os.environ, "DATABASE_URL": dsn} if via == "DATABASE_URL" else None
    done = subprocess.run(
        [sys.executable, "-m", "pgsolo", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode in (2, 69), done.stderr
    assert "Hunter2pw" not in done.stderr + done.stdout


@pytest.mark.parametrize(
    ("option", "value"),
    [("sslmode", "Requir3d"), ("target_session_attrs", "rw-only9"), ("gssencmode", "0n-please")],
)
@pytest.mark.parametrize("command", [["run", "--key", "k", "--json"], ["locks"]])
def test_an_option_value_libpq_refuses_is_a_usage_error(
    command: list[str], option: str, value: str
) -> None:
    """libpq refuses `sslmode=Requir3d` only as it connects, which read as "database
    unavailable" (exit 69): it is the user's mistake, exit 2, before anything connects,
    its value not shown (a misplaced password would show)."""
    dsn = f"host=127.0.0.1 port=1 {option}={value}"
    done = pgsolo(*command, "--dsn", dsn, *(["--", "true"] if command[0] == "run" else []))
    assert done.returncode == 2, done.stderr
    assert f"invalid connection string in --dsn: {option} must be one of" in done.stderr
    assert value not in done.stderr + done.stdout


@pytest.mark.parametrize(
    "dsn",
    [
        "host=127.0.0.1 port=1 password=verify-full sslmode=verify-full",
        "postgresql://app:verify-full@127.0.0.1:1/db?sslmode=verify-full",
    ],
)
def test_a_password_that_is_also_another_options_value_is_never_shown(dsn: str) -> None:
    """Redaction rebuilt the string with the password blanked out but kept `sslmode=`'s
    value, the same text: the password showed there."""
    for args in (["run", "--dsn", dsn, "--key", "k", "true"], ["locks", "--dsn", dsn]):
        done = pgsolo(*args)
        assert done.returncode in (2, 69), done.stderr
        assert "verify-full" not in done.stderr + done.stdout, done.stderr


@pytest.mark.parametrize(
    "args",
    [
        # An abbreviation of --dsn, and COMMAND without `--`: the corrected line and the
        # JSON document showed the abbreviation's value.
        [
            "run",
            "--json",
            "--ds",
            "postgresql://app:Hunter2pw@127.0.0.1:1/app",
            "--key",
            "k",
            "true",
        ],
        ["run", "--json", "--ds=postgresql://app:Hunter2pw@127.0.0.1:1/app", "--key", "k", "true"],
        # An unquoted key=value DSN: argparse's "unrecognized arguments" echoed its words.
        ["locks", "--dsn", "host=127.0.0.1", "password=Hunter2pw", "dbname=app"],
        ["doctor", "--json", "--dsn", "host=127.0.0.1", "password=Hunter2pw"],
        # ... and pgsolo run took them for COMMAND, whose name the corrected line shows.
        ["run", "--key", "k", "--dsn", "host=127.0.0.1", "password=Hunter2pw", "--", "true"],
        # A value argparse refuses, echoed in its message.
        ["run", "--key", "k", "--check-timeout", "password=Hunter2pw", "--", "true"],
    ],
    ids=["abbreviated", "abbreviated=", "unquoted", "unquoted-json", "unquoted-run", "refused"],
)
def test_a_usage_error_never_shows_a_password_of_the_command_line(args: list[str]) -> None:
    done = pgsolo(*args)
    assert done.returncode == 2, done.stderr
    assert "Hunter2pw" not in done.stderr + done.stdout, done.stderr
