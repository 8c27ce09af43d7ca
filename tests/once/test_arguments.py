"""Bad input to ``run_once``: operation keys (empty, too long, not text; the longest ones
accepted), operations, waits, a connection inside a transaction, a database not migrated.
A typed error, and nothing ran, was written or is held.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import CLOSED_PORT_DSN, IDLE, Connect, locks_of, new_op, recorder, row_of
from pgsolo import (
    ConnectionStateError,
    InvalidOperationError,
    InvalidOperationKeyError,
    UsageError,
    run_once,
)
from pgsolo.once.operation import (
    MAX_OP_KEY_BYTES,
)

BAD_OP_KEYS = [
    ("", "empty"),
    ("x" * (MAX_OP_KEY_BYTES + 1), "too-long"),
    ("é" * (MAX_OP_KEY_BYTES // 2) + "x", "too-long-utf8"),
    ("charge:\0order", "nul"),
    ("\udc80", "surrogate"),
    (b"charge:order:1", "bytes"),
    (8812, "int"),
    (None, "none"),
]


@pytest.mark.parametrize("op_key", [k for k, _ in BAD_OP_KEYS], ids=[i for _, i in BAD_OP_KEYS])
def test_bad_operation_keys_are_refused_before_anything_runs(
    db: str, connect: Connect, observer: Any, op_key: object
) -> None:
    calls, operation = recorder()
    before = observer.conn.execute("SELECT count(*) FROM pgsolo.operations").fetchone()
    conn = connect()
    with pytest.raises(InvalidOperationKeyError) as raised:
        pgsolo.run_once(conn, op_key, operation)  # type: ignore[arg-type]
    assert isinstance(raised.value, UsageError)
    assert isinstance(raised.value, ValueError)
    assert calls == []
    assert observer.conn.execute("SELECT count(*) FROM pgsolo.operations").fetchone() == before
    assert locks_of(observer, conn) == set()
    # before any SQL: a closed connection gives the same error, not a connection error
    conn.close()
    with pytest.raises(InvalidOperationKeyError):
        pgsolo.run_once(conn, op_key, operation)  # type: ignore[arg-type]


def test_the_longest_operation_key_is_accepted(db: str, connect: Connect, observer: Any) -> None:
    op = "é" * (MAX_OP_KEY_BYTES // 2)
    assert len(op.encode()) == MAX_OP_KEY_BYTES
    observer.conn.execute("DELETE FROM pgsolo.operations WHERE op_key = %s", (op,))
    assert pgsolo.run_once(connect(), op, lambda ctx: 1).outcome == "ran"


async def _async_operation(ctx: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("operation", "wait", "error"),
    [
        ("not callable", None, InvalidOperationError),
        (None, None, InvalidOperationError),
        (_async_operation, None, InvalidOperationError),
        (lambda ctx: 1, 0, UsageError),
        (lambda ctx: 1, -1, UsageError),
        (lambda ctx: 1, math.nan, UsageError),
        (lambda ctx: 1, 10**9, UsageError),
        (lambda ctx: 1, "1", UsageError),
        (lambda ctx: 1, True, UsageError),
    ],
    ids=[
        "str",
        "none",
        "async-fn",
        "wait-0",
        "wait-neg",
        "wait-nan",
        "wait-huge",
        "wait-str",
        "wait-bool",
    ],
)
def test_bad_operations_and_waits_are_refused_before_anything_runs(
    db: str, connect: Connect, observer: Any, operation: Any, wait: Any, error: type[Exception]
) -> None:
    op = new_op()
    conn = connect()
    with pytest.raises(error):
        pgsolo.run_once(conn, op, operation, wait=wait)
    assert row_of(observer, op) is None
    assert locks_of(observer, conn) == set()
    conn.close()
    with pytest.raises(error):
        pgsolo.run_once(conn, op, operation, wait=wait)


def test_a_connection_inside_a_transaction_is_refused(
    db: str, connect: Connect, observer: Any
) -> None:
    conn = connect()
    op = new_op()
    calls, operation = recorder()
    with conn.transaction(), pytest.raises(ConnectionStateError, match="no transaction open"):
        pgsolo.run_once(conn, op, operation)
    assert calls == []
    assert row_of(observer, op) is None


@pytest.mark.parametrize("autocommit", [True, False], ids=["autocommit", "implicit-begin"])
def test_before_migrate_is_a_usage_error_and_nothing_runs(
    fresh_db: str, observer: Any, autocommit: bool
) -> None:
    calls, operation = recorder()
    with psycopg.connect(fresh_db, autocommit=autocommit) as conn:
        with pytest.raises(UsageError, match="pgsolo migrate"):
            pgsolo.run_once(conn, new_op(), operation)
        assert calls == []
        assert conn.info.transaction_status == IDLE
        assert locks_of(observer, conn) == set()


# -- found in review -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wide", "count", "tail"), [("é", 250, ""), ("€", 166, "ab"), ("😀", 125, "")]
)
def test_op_keys_at_exactly_the_byte_limit_run(
    db: str, connect: Connect, wide: str, count: int, tail: str
) -> None:
    """Operation keys of exactly the byte limit (512 UTF-8 bytes of 2-, 3- or 4-byte
    characters) must run and read their result back: the limit counts bytes, not characters,
    and nothing after the check (the lock key, the row) refuses a key the check let through."""
    op_key = uuid.uuid4().hex[:12] + wide * count + tail  # unique per run, 512 bytes
    assert len(op_key.encode()) == 512
    conn = connect()
    assert run_once(conn, op_key, lambda ctx: [2**70, "ü", {"k": None}]).outcome in (
        "ran",
        "already-succeeded",
    )
    again = run_once(conn, op_key, lambda ctx: None)
    assert again.result == [2**70, "ü", {"k": None}]


def test_bad_arguments_with_a_connection_string_fail_before_connecting() -> None:
    """With a connection string, a bad operation key or wait is refused before pgsolo
    opens anything (nothing listens on the string's port: a connection error would say
    so), and a string that is no connection string is an ``InvalidDsnError``."""
    with pytest.raises(InvalidOperationKeyError):
        run_once(CLOSED_PORT_DSN, "", lambda ctx: None)
    with pytest.raises(UsageError, match="wait"):
        run_once(CLOSED_PORT_DSN, new_op(), lambda ctx: None, wait=-1)
    with pytest.raises(pgsolo.InvalidDsnError):
        run_once("host=a port=notaport", new_op(), lambda ctx: None)
