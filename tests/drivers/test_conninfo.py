"""Connection strings: ``redact_dsn`` hides the password and keeps the rest, and
``scrub_secrets`` cleans the driver's messages.
"""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgsolo.drivers.conninfo import redact_dsn, scrub_secrets


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
