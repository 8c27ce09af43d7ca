"""``leader()`` and ``leader_async()`` refuse what they cannot use before anything
connects: the DSN here points at a port where no server listens, so a check that came
after connecting would raise DatabaseUnavailableError instead of the typed error."""

from __future__ import annotations

import math
from typing import Any

import pytest

import pgsolo
from _drivers import pg8000_options
from pgsolo.keys import from_name, leader_key

NOWHERE = "postgresql://leader:secret-pw-41@127.0.0.1:1/nowhere?connect_timeout=2"

BAD_NAMES: list[tuple[Any, str]] = [
    (5, "must be a str"),
    (b"scheduler", "must be a str"),
    ("", "must not be empty"),
    ("sched\0uler", "NUL"),
    ("x" * 513, "at most 512 UTF-8 bytes"),
    ("é" * 257, "at most 512 UTF-8 bytes"),
    ("\ud800", "valid Unicode"),
]

BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"wait": None}, "a candidate waits to lead"),
    # The candidate's own words: a lock's advice to try once with wait=None, which a
    # candidate refuses, is not given (before: it was, for each of these).
    ({"wait": -1}, r"^wait must be .*math\.inf \(the default\).*got -1$"),
    ({"wait": 0}, r"^wait must be .*got 0$"),
    ({"wait": "5"}, r"^wait must be .*got '5'$"),
    ({"wait": math.nan}, r"^wait must be .*got nan$"),
    ({"fencing": "yes"}, "fencing must be True or False"),
    ({"keep": "yes"}, "keep must be True, False or a pgsolo.Keep"),
    ({"keep": 1}, "keep must be True, False or a pgsolo.Keep"),
]


@pytest.mark.parametrize(("name", "says"), BAD_NAMES)
def test_a_bad_name_is_refused_before_connecting(name: Any, says: str) -> None:
    with pytest.raises(pgsolo.InvalidKeyError, match=says), pgsolo.leader(NOWHERE, name):
        pytest.fail("a bad name led")


@pytest.mark.parametrize(("name", "says"), BAD_NAMES)
async def test_a_bad_name_is_refused_before_connecting_async(name: Any, says: str) -> None:
    with pytest.raises(pgsolo.InvalidKeyError, match=says):
        async with pgsolo.leader_async(NOWHERE, name):
            pytest.fail("a bad name led")


@pytest.mark.parametrize(("options", "says"), BAD_OPTIONS)
def test_a_bad_option_is_refused_before_connecting(options: dict[str, Any], says: str) -> None:
    with (
        pytest.raises(pgsolo.InvalidArgumentError, match=says),
        pgsolo.leader(NOWHERE, "scheduler", **options),
    ):
        pytest.fail("a bad option led")


@pytest.mark.parametrize(("options", "says"), BAD_OPTIONS)
async def test_a_bad_option_is_refused_before_connecting_async(
    options: dict[str, Any], says: str
) -> None:
    with pytest.raises(pgsolo.InvalidArgumentError, match=says):
        async with pgsolo.leader_async(NOWHERE, "scheduler", **options):
            pytest.fail("a bad option led")


def test_the_errors_never_show_the_password() -> None:
    with pytest.raises(pgsolo.DatabaseUnavailableError) as caught, pgsolo.leader(NOWHERE, "s"):
        pytest.fail("led without a server")
    assert "secret-pw-41" not in str(caught.value)


def test_a_leader_name_is_the_key_of_its_prefixed_name_in_python_and_in_sql(
    connect: Any,
) -> None:
    """DESIGN §2, leader keys: other languages compute the key from key spec v1."""
    key = leader_key("scheduler")
    assert key == from_name("pgsolo:leader:scheduler")
    row = (
        connect()
        .execute(
            "SELECT ('x' || substr(encode(sha256(convert_to('pgsolo:leader:' || %s, 'UTF8')),"
            " 'hex'), 1, 16))::bit(64)::bigint",
            ("scheduler",),
        )
        .fetchone()
    )
    assert row == (key.value,)
    assert key.value == -6736169564085083167  # the vector of DESIGN §2


def test_a_connection_no_keeper_can_share_is_refused_before_any_sql(dsn: str) -> None:
    dbapi = pytest.importorskip("pg8000.dbapi")
    conn = dbapi.connect(**pg8000_options(dsn))
    conn.autocommit = True
    try:
        with (
            pytest.raises(pgsolo.UsageError, match="Pass a connection string instead"),
            pgsolo.leader(conn, "scheduler"),
        ):
            pytest.fail("led unwatched")
        cursor = conn.cursor()
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'"
        )
        assert cursor.fetchone() == [0]
    finally:
        conn.close()
