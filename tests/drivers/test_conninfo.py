"""Connection strings: ``redact_dsn`` hides the password and keeps the rest,
``scrub_secrets`` cleans the driver's messages, and a URI may name its driver the way
SQLAlchemy writes ``DATABASE_URL`` (``postgresql+psycopg2://``). libpq's reading of a
string is kept for the next run that reads it (a job opening a connection per run), and
that changes nothing a caller sees.
"""

from __future__ import annotations

import urllib.parse

import pytest
from psycopg.conninfo import conninfo_to_dict

import pgsolo
from _support import pgsolo_cli, unique_name
from pgsolo.drivers.conninfo import conninfo_for, parse_dsn, redact_dsn, scrub_secrets
from pgsolo.dsn import DEFAULT_CONNECT_TIMEOUT, libpq_dsn


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
        "postgresql://postgres:@/postgres?host=/tmp/x",  # the embedded server's URI: empty password
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


def test_scrub_secrets_blanks_the_pieces_of_a_password_libpq_cut_at_an_at_sign() -> None:
    """Guards a password with an unencoded '@': libpq keeps what comes before it, and
    reads the rest as the host, which the driver's message then quotes."""
    dsn = "postgresql://pgsolo:Se@CrEtC@127.0.0.1:5432/app"
    message = "failed to resolve host 'CrEtC@127.0.0.1': Name or service not known"
    scrubbed = scrub_secrets(message, dsn)
    assert "CrEtC" not in scrubbed
    assert scrubbed == "failed to resolve host '***@127.0.0.1': Name or service not known"


@pytest.mark.parametrize(
    ("password", "message", "expected"),
    [
        (
            "p",
            "connection to port 5432 refused (password p)",
            "connection to port 5432 refused (password ***)",
        ),
        ("5432", "port 5432 refused; 54321 is not it", "port *** refused; 54321 is not it"),
        ("a-b", "server said a-b, and a-bc", "server said ***, and a-bc"),
        ("!x", "got !x and y!x", "got *** and y***"),
    ],
)
def test_scrub_secrets_blanks_a_short_password_only_where_it_stands_alone(
    password: str, message: str, expected: str
) -> None:
    """Regression: a one-letter password blanked every p of the message ("***ort"), so
    the error said nothing readable. A password's letters and digits at its edges must
    not run on into others; punctuation at an edge needs no such boundary."""
    assert scrub_secrets(message, f"host=h password={password}") == expected


def as_sqlalchemy_url(dsn: str, scheme: str) -> str:
    """``dsn`` (any form) spelled as a SQLAlchemy URL of ``scheme``."""
    return f"{scheme}:///?{urllib.parse.urlencode(conninfo_to_dict(dsn))}"


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql+psycopg2://u:pw@db/app", "postgresql://u:pw@db/app"),
        ("postgresql+psycopg://u@db/app?sslmode=require", "postgresql://u@db/app?sslmode=require"),
        ("postgres+asyncpg://u@db/app", "postgresql://u@db/app"),
        ("postgresql+pg8000://db", "postgresql://db"),
        ("POSTGRESQL://db/app", "postgresql://db/app"),
        ("Postgres+Psycopg2://db", "postgresql://db"),
        ("postgresql://db/app", "postgresql://db/app"),  # libpq's own: as given
        ("postgres://db/app", "postgres://db/app"),
        ("host=db password=a+b://c", "host=db password=a+b://c"),  # key=value: as given
        ("", ""),
    ],
)
def test_a_uri_may_name_its_driver_as_sqlalchemy_does(dsn: str, expected: str) -> None:
    assert libpq_dsn(dsn) == expected
    assert parse_dsn(dsn) == (conninfo_to_dict(expected) if expected else {})


@pytest.mark.parametrize(
    "dsn",
    [
        "mysql://u:Hunter2pw@db/app",
        "mysql+pymysql://u:Hunter2pw@db/app",
        "sqlite:///app.db",
        "postgresql+two+drivers://u:Hunter2pw@db",
        "pg://u:Hunter2pw@db/app",
    ],
)
def test_a_uri_of_another_database_is_refused_with_the_schemes_to_use(dsn: str) -> None:
    with pytest.raises(pgsolo.InvalidDsnError) as raised:
        parse_dsn(dsn)
    message = str(raised.value)
    assert f"is a {dsn.partition('://')[0]}:// URI" in message
    assert "postgresql+psycopg://" in message
    assert "Hunter2pw" not in message
    assert "Hunter2pw" not in redact_dsn(dsn)
    assert redact_dsn(dsn).partition("://")[0] == dsn.partition("://")[0]


def test_a_driver_parameter_libpq_lacks_gets_a_hint() -> None:
    with pytest.raises(pgsolo.InvalidDsnError, match="sslmode=") as raised:
        parse_dsn("postgresql+asyncpg://u:Hunter2pw@db/app?ssl=require")
    assert "Hunter2pw" not in str(raised.value)


def test_a_sqlalchemy_url_connects_a_job_and_the_command_line(dsn: str) -> None:
    url = as_sqlalchemy_url(dsn, "postgresql+psycopg2")
    result = pgsolo.run_job(url, unique_name("sqlalchemy-url"), lambda conn: "done")
    assert (result.outcome, result.value) == ("completed", "done")
    done = pgsolo_cli("locks", env={"DATABASE_URL": as_sqlalchemy_url(dsn, "postgres+asyncpg")})
    assert done.returncode == 0, done.stderr


def test_the_command_line_refuses_another_database_as_a_usage_error() -> None:
    done = pgsolo_cli("locks", env={"DATABASE_URL": "mysql://u:Hunter2pw@db/app"})
    assert done.returncode == 2
    assert "invalid connection string in DATABASE_URL" in done.stderr
    assert "mysql:// URI" in done.stderr
    assert "Hunter2pw" not in done.stderr + done.stdout


def test_a_parsed_string_is_the_callers_own_to_change() -> None:
    """Guards the cache of libpq's readings: a caller that changes what it was given (the
    test clusters do) does not change what the next reader of the string gets."""
    secret = unique_name("pw")
    dsn = f"host=h dbname={unique_name('db')} password={secret}"
    first = parse_dsn(dsn)
    first["host"] = "elsewhere"
    del first["password"]
    again = parse_dsn(dsn)
    assert again["host"] == "h"
    assert again["password"] == secret


@pytest.mark.parametrize(
    ("option", "value"),
    [("sslmode", "Requir3d"), ("target_session_attrs", "rw-only9"), ("channel_binding", "0n")],
)
def test_an_option_value_libpq_refuses_is_a_usage_error_before_connecting(
    option: str, value: str
) -> None:
    """Regression: libpq refuses ``sslmode=requir`` only as it connects, so run_job
    raised DatabaseUnavailableError (which says: retry later) and quoted the value; the
    CLI alone said it was the caller's mistake. The value is never shown: a misplaced
    password would be."""
    dsn = f"host=127.0.0.1 port=1 user=u {option}={value}"
    with pytest.raises(pgsolo.InvalidDsnError, match=f"{option} must be one of") as raised:
        parse_dsn(dsn)
    assert value not in str(raised.value)
    with pytest.raises(pgsolo.InvalidDsnError) as raised:
        pgsolo.run_job(dsn, unique_name("job"), lambda conn: None)
    assert value not in str(raised.value)


def test_a_bad_string_is_refused_each_time_it_is_read() -> None:
    with pytest.raises(pgsolo.InvalidDsnError):
        parse_dsn("host='unclosed")
    with pytest.raises(pgsolo.InvalidDsnError):
        parse_dsn("host='unclosed")


def test_the_defaults_follow_the_environment_between_connections(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Guards the cache of pgsolo's connection strings: the defaults are read at each
    connection, so PGCONNECT_TIMEOUT set between two runs of one job is honoured."""
    dsn = f"host=h dbname={unique_name('db')}"
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert conninfo_to_dict(conninfo_for(dsn, "job"))["connect_timeout"] == str(
        DEFAULT_CONNECT_TIMEOUT
    )
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "3")
    assert "connect_timeout" not in conninfo_to_dict(conninfo_for(dsn, "job"))
    assert conninfo_to_dict(conninfo_for(dsn, "other job"))["application_name"] == "other job"
