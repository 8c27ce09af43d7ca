"""The results ``run_once`` stores: what cannot be stored is refused (and the attempt
retried with the same key), the largest storable result is stored, and a stored value
reads back as the same type.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import pgsolo
from _support import IDLE, Connect, locks_of, new_op, recorder, row_of, work_rows
from pgsolo import (
    ResultNotStorableError,
    UsageError,
    run_once,
)
from pgsolo.once.operation import (
    MAX_RESULT_BYTES,
    storable_result,
)


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {"amount": math.nan},
        {"amount": math.inf},
        {1j: "complex key"},
        b"bytes",
        {"note": "a\0b"},
        {"a\0b": 1},
        ["\ud800"],
        "x" * (MAX_RESULT_BYTES - 1),  # two quotes make it one byte too many
    ],
    ids=["object", "nan", "inf", "bad-key", "bytes", "nul", "nul-key", "surrogate", "too-large"],
)
def test_results_that_cannot_be_stored_are_refused(value: object) -> None:
    with pytest.raises(ResultNotStorableError) as raised:
        storable_result(value)
    assert isinstance(raised.value, UsageError)
    assert isinstance(raised.value, ValueError)


def test_the_largest_storable_result_is_stored(db: str, connect: Connect, observer: Any) -> None:
    largest = "é" * ((MAX_RESULT_BYTES - 2) // 2)  # two bytes each, plus two quotes
    assert len(storable_result(largest).encode()) == MAX_RESULT_BYTES
    op = new_op()
    assert pgsolo.run_once(connect(), op, lambda ctx: largest).result == largest
    row = row_of(observer, op)
    assert row is not None
    assert row["result"] == largest


@pytest.mark.parametrize(
    "value", [object(), "x" * MAX_RESULT_BYTES, {"n": math.nan}], ids=["object", "large", "nan"]
)
def test_a_result_that_cannot_be_stored_commits_nothing_and_is_retried_with_the_same_key(
    db: str, connect: Connect, observer: Any, value: object
) -> None:
    conn = connect()
    op = new_op()
    calls, operation = recorder(value)

    with pytest.raises(ResultNotStorableError):
        pgsolo.run_once(conn, op, operation)
    row = row_of(observer, op)
    assert row is not None
    assert row["state"] == "failed"
    assert row["result"] is None
    assert "ResultNotStorableError" in row["error"]
    assert work_rows(observer, op) == []  # not committed without its record
    assert locks_of(observer, conn) == set()
    assert conn.info.transaction_status == IDLE

    fixed_calls, fixed = recorder("ok")
    assert pgsolo.run_once(conn, op, fixed).attempts == 2
    assert fixed_calls[0].idempotency_key == calls[0].idempotency_key
    assert work_rows(observer, op) == ["work"]


# -- found in review -----------------------------------------------------------------------


@pytest.mark.parametrize("value", [1e16, 1e300, -0.0, 1.0])
def test_a_stored_float_reads_back_as_the_same_type(
    db: str, connect: Connect, value: float
) -> None:
    """'ran' returns json.loads(stored) (a float); 'already-succeeded' returns what jsonb
    gave back, which prints 1e16 as 10000000000000000 (an int in Python). The same
    operation's result then changes type between the first call and every later one."""
    conn = connect()
    op_key = new_op("review2")
    first = run_once(conn, op_key, lambda ctx: {"amount": value})
    again = run_once(conn, op_key, lambda ctx: None)
    assert again.outcome == "already-succeeded"
    assert type(again.result["amount"]) is type(first.result["amount"]), (
        first.result,
        again.result,
    )
    assert again.result == first.result
