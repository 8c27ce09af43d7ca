"""``semaphore()`` refuses what it cannot use before any SQL is sent, and its slots' keys
are the normative ones (DESIGN §2, Semaphore keys) in Python and in SQL."""

from __future__ import annotations

import math
from typing import Any

import pytest

import pgsolo
from _support import Connect
from pgsolo.keys import from_name, semaphore_keys

BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"name": "", "limit": 3}, pgsolo.InvalidKeyError, "must not be empty"),
    ({"name": 5, "limit": 3}, pgsolo.InvalidKeyError, "must be a str"),
    ({"name": "a\0b", "limit": 3}, pgsolo.InvalidKeyError, "NUL"),
    ({"name": "x" * 513, "limit": 3}, pgsolo.InvalidKeyError, "at most 512"),
    ({"name": "s", "limit": 0}, pgsolo.InvalidArgumentError, "limit must be an int from 1"),
    ({"name": "s", "limit": -1}, pgsolo.InvalidArgumentError, "limit must be an int from 1"),
    ({"name": "s", "limit": 1025}, pgsolo.InvalidArgumentError, "limit must be an int from 1"),
    ({"name": "s", "limit": True}, pgsolo.InvalidArgumentError, "limit must be an int from 1"),
    ({"name": "s", "limit": 2.0}, pgsolo.InvalidArgumentError, "limit must be an int from 1"),
    ({"name": "s", "limit": 2, "wait": -1}, pgsolo.InvalidArgumentError, "wait"),
    ({"name": "s", "limit": 2, "wait": math.nan}, pgsolo.InvalidArgumentError, "wait"),
    ({"name": "s", "limit": 2, "fencing": "yes"}, pgsolo.InvalidArgumentError, "fencing"),
    ({"name": "s", "limit": 2, "keep": "yes"}, pgsolo.InvalidArgumentError, "keep"),
]


@pytest.mark.parametrize(("arguments", "error", "says"), BAD)
def test_bad_arguments_are_refused_before_any_sql(
    arguments: dict[str, Any], error: type[Exception], says: str, connect: Connect
) -> None:
    conn = connect()
    before = conn.pgconn.transaction_status, conn.execute("SELECT 1").fetchone()
    with pytest.raises(error, match=says):
        pgsolo.semaphore(conn, **arguments)
    assert (conn.pgconn.transaction_status, conn.execute("SELECT 1").fetchone()) == before


def test_a_slots_key_is_the_key_of_its_name_in_python_and_in_sql(connect: Connect) -> None:
    keys = semaphore_keys("tenant-export", 3)
    assert keys == tuple(from_name(f"pgsolo:semaphore:tenant-export:{i}") for i in range(3))
    assert keys[0].value == -3778489986784301117  # the vector of DESIGN §2
    row = (
        connect()
        .execute(
            "SELECT ('x' || substr(encode(sha256(convert_to('pgsolo:semaphore:' || %s || ':' || %s,"
            " 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint",
            ("tenant-export", 2),
        )
        .fetchone()
    )
    assert row == (keys[2].value,)
