"""The ``pgsolo`` command, run for real in subprocesses (``python -m pgsolo``).

``pgsolo key`` is checked against the key spec v1 vectors, and the SQL it prints is run
on the test server: it must take the very lock pgsolo computes (pg_locks says so).
Connection strings are checked for one thing above all: a password never gets printed.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from _support import run_cli as pgsolo
from pgsolo.cli import main
from pgsolo.drivers.conninfo import redact_dsn, scrub_secrets
from pgsolo.dsn import EMBEDDED, choose_dsn
from pgsolo.keys import Key

Connect = Callable[..., psycopg.Connection]

# DESIGN.md §2 test vectors: name -> (int64 key, int32 half)
VECTORS = {
    "daily-settlement": (-2533923874772390729, -589975127),
    "expired-session-cleanup": (1464048641933150878, 340875387),
    "tenant-export": (-4731608009049143110, -1101663339),
    "Grüße": (-559005354142841542, -130153577),
}


def key_json(*args: str) -> dict[str, object]:
    done = pgsolo("key", *args, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert isinstance(data, dict)
    return data


# -- pgsolo key --------------------------------------------------------------------------


def test_key_prints_the_spec_vector() -> None:
    done = pgsolo("key", "daily-settlement")
    assert done.returncode == 0, done.stderr
    assert "-2533923874772390729" in done.stdout
    sql_lines = [line for line in done.stdout.splitlines() if line.startswith("SELECT")]
    assert sql_lines == [
        "SELECT pg_try_advisory_lock(('x' || substr(encode(sha256(convert_to("
        "'daily-settlement', 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint);",
        "SELECT pg_try_advisory_lock(-2533923874772390729);",
    ]


def test_key_with_namespace_prints_the_pair() -> None:
    done = pgsolo("key", "daily-settlement", "--namespace", "42")
    assert done.returncode == 0, done.stderr
    assert "42:-589975127" in done.stdout
    assert "SELECT pg_try_advisory_lock(42, -589975127);" in done.stdout.splitlines()


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_key_json_matches_every_vector(name: str) -> None:
    int64, int32 = VECTORS[name]
    info = key_json(name)
    assert {k: v for k, v in info.items() if k != "sql"} == {
        "name": name,
        "key": str(int64),
        "namespace": None,
        "resource": None,
        "sql_numeric": f"SELECT pg_try_advisory_lock({int64});",
    }
    assert str(info["sql"]).startswith("SELECT pg_try_advisory_lock(('x' || substr(")
    pair = key_json(name, "--namespace", "42")
    assert (pair["key"], pair["namespace"], pair["resource"]) == (f"42:{int32}", 42, int32)
    assert pair["sql_numeric"] == f"SELECT pg_try_advisory_lock(42, {int32});"


@pytest.mark.parametrize(
    ("name", "namespace"),
    [
        ("daily-settlement", None),
        ("daily-settlement", "42"),
        ("Grüße", None),
        ("it's a \\ test", "-7"),  # quote and backslash must survive into the SQL literal
    ],
)
def test_printed_sql_takes_the_same_lock(
    connect: Connect, observer: Any, name: str, namespace: str | None
) -> None:
    args = [name] if namespace is None else [name, "--namespace", namespace]
    info = key_json(*args)
    expected = Key.parse(name, namespace=None if namespace is None else int(namespace))
    assert info["key"] == expected.text

    holder, other = connect(), connect()
    try:
        row = holder.execute(str(info["sql"])).fetchone()
        assert row == (True,)
        assert observer.advisory(pid=holder.info.backend_pid) == {expected}
        # The numeric form is the same lock: another session finds it taken.
        assert other.execute(str(info["sql_numeric"])).fetchone() == (False,)
    finally:
        holder.execute("SELECT pg_advisory_unlock_all()")
    assert other.execute(str(info["sql_numeric"])).fetchone() == (True,)
    assert observer.advisory(pid=other.info.backend_pid) == {expected}
    other.execute("SELECT pg_advisory_unlock_all()")


def test_derived_sql_expression_computes_the_key(connect: Connect) -> None:
    conn = connect()
    for name, (int64, int32) in VECTORS.items():
        sql = str(key_json(name)["sql"])
        expression = sql.removeprefix("SELECT pg_try_advisory_lock(").removesuffix(");")
        assert conn.execute(f"SELECT {expression}").fetchone() == (int64,)
        pair_sql = str(key_json(name, "--namespace", "42")["sql"])
        pair = pair_sql.removeprefix("SELECT pg_try_advisory_lock(").removesuffix(");")
        assert conn.execute(f"SELECT {pair}").fetchone() == (42, int32)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", {"key": "123", "namespace": None, "resource": None}),
        ("-5", {"key": "-5", "namespace": None, "resource": None}),
        ("42:1001", {"key": "42:1001", "namespace": 42, "resource": 1001}),
    ],
)
def test_key_accepts_numeric_forms(text: str, expected: dict[str, object]) -> None:
    info = key_json(text)
    assert {k: info[k] for k in expected} == expected
    assert info["name"] is None
    assert (
        info["sql"]
        == info["sql_numeric"]
        == f"SELECT pg_try_advisory_lock({text.replace(':', ', ')});"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["key", ""], "must not be empty"),
        (["key", "123", "--namespace", "4"], "names only"),
        (["key", "9223372036854775808"], "int64"),
        (["key", "2147483648:1"], "pair"),
        (["key", "x" * 1025], "1024"),
        (["key", "job", "--namespace", "2147483648"], "namespace"),
    ],
)
def test_bad_key_is_a_usage_error(args: list[str], message: str) -> None:
    done = pgsolo(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert message in done.stderr
    assert "Traceback" not in done.stderr


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


# -- connections -------------------------------------------------------------------------


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
    assert done.stdout == ""


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
    ("dsn", "expected"),
    [
        (
            "postgresql://alice:s3cret@db.example:5433/app",
            "postgresql://alice:***@db.example:5433/app",
        ),
        (
            "postgres://alice:s3cret@h1:5432,h2:5433/app?sslmode=require&application_name=x",
            "postgres://alice:***@h1:5432,h2:5433/app?sslmode=require&application_name=x",
        ),
        ("postgresql://alice:p%40ss%2Fw@h/app", "postgresql://alice:***@h/app"),
        ("postgresql://alice:pa?ss@h/app", "postgresql://alice:***@h/app"),  # libpq allows '?'
        (
            "postgresql://alice@h/app?password=s3cret&sslmode=disable",
            "postgresql://alice@h/app?password=***&sslmode=disable",
        ),
        (
            "host=db.example port=5433 user=alice password=s3cret dbname=app",
            "host=db.example port=5433 user=alice password=*** dbname=app",
        ),
        ("host=h password = 's3 cr\\'et' dbname=app", "host=h password = *** dbname=app"),
        ("host=h sslpassword=s3cret dbname=app", "host=h sslpassword=*** dbname=app"),
    ],
)
def test_redact_dsn_hides_the_password_and_keeps_the_rest(dsn: str, expected: str) -> None:
    redacted = redact_dsn(dsn)
    assert redacted == expected
    original = conninfo_to_dict(dsn)
    secrets = [str(original[k]) for k in ("password", "sslpassword") if k in original]
    assert secrets
    for secret in secrets:
        assert secret not in redacted
    # Everything else means exactly what it meant before.
    safe = {k: ("***" if k in ("password", "sslpassword") else v) for k, v in original.items()}
    assert conninfo_to_dict(redacted) == safe


@pytest.mark.parametrize(
    "dsn",
    [
        "",
        "embedded",
        "postgresql://alice@h/app",
        "postgresql://postgres:@/postgres?host=/tmp/x",  # pgserver's URI: empty password
        "host=h dbname=app",
    ],
)
def test_redact_dsn_leaves_passwordless_strings_alone(dsn: str) -> None:
    assert redact_dsn(dsn) == dsn


def test_scrub_secrets_cleans_driver_messages() -> None:
    dsn = "postgresql://alice:hunter2@h/app"
    message = f"could not connect with {dsn}: password hunter2 rejected"
    assert scrub_secrets(message, dsn) == (
        "could not connect with postgresql://alice:***@h/app: password *** rejected"
    )
    assert "s3cret" not in scrub_secrets("bad s3cret", "host=h password=s3cret")


# -- pgsolo run: COMMAND after `--` ---------------------------------------------------------


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
        done = pgsolo("run", "--key", "cli-separator", "--dsn", dsn, "--json", *command)
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
    done = pgsolo(
        "run", "--key", "cli-separator-2", "--dsn", db, "--", sys.executable, "-c", show,
        "--wait", "5", "--", "--key",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["--wait", "5", "--", "--key"]
