"""Every key a user can pass (ints, pairs, names, and what is none of these), fuzzed against
key spec v1 (DESIGN §2) and a real server: a valid key is locked and released normally; any
other is a typed :class:`pgsolo.UsageError` raised before any SQL is sent."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pgsolo
from _support import HOSTILE_TEXT, assert_clean, fuzz, nothing_sent
from pgsolo import Key

INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
EDGES = [0, 1, -1, *INT64, INT64[0] - 1, INT64[1] + 1, *INT32, INT32[0] - 1, INT32[1] + 1, 2**200]

INTEGERS = st.one_of(st.integers(), st.sampled_from(EDGES))
NOT_INTS = st.one_of(
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.binary(max_size=8),
    st.decimals(allow_nan=False).map(str),
)
PARTS = st.one_of(INTEGERS, NOT_INTS, HOSTILE_TEXT)
PAIRS = st.one_of(
    st.tuples(INTEGERS, INTEGERS),
    st.lists(PARTS, max_size=4).map(tuple),
    st.lists(INTEGERS, min_size=2, max_size=2),  # a list is never a pair
    st.frozensets(INTEGERS, max_size=2),
)
KEYS = st.one_of(INTEGERS, NOT_INTS, PAIRS, HOSTILE_TEXT)


def expected_key(value: object) -> Key | None:
    """Key spec v1 restated: the key ``value`` names, or None when it is no key."""

    def is_int(part: object, low: int, high: int) -> bool:
        return type(part) is int and low <= part <= high

    if is_int(value, *INT64):
        return Key(value)  # type: ignore[arg-type]
    if type(value) is tuple and len(value) == 2 and all(is_int(p, *INT32) for p in value):
        return Key(value)  # type: ignore[arg-type]
    if type(value) is str and value and "\0" not in value:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            return None
        return pgsolo.as_key(value) if size <= 1024 else None
    return None


@fuzz(300)
@given(KEYS)
def test_as_key_accepts_exactly_key_spec_v1(value: Any) -> None:
    """A value is a key exactly when the spec says so; anything else is InvalidKeyError
    (never a TypeError, UnicodeEncodeError or OverflowError from inside)."""
    expected = expected_key(value)
    if expected is None:
        with pytest.raises(pgsolo.InvalidKeyError):
            pgsolo.as_key(value)
    else:
        assert pgsolo.as_key(value) == expected


@fuzz(60)
@given(HOSTILE_TEXT, st.one_of(INTEGERS, NOT_INTS.filter(lambda v: v is not None)))
def test_a_name_with_any_namespace_is_a_pair_key_or_a_usage_error(
    name: Any, namespace: Any
) -> None:
    try:
        key = pgsolo.as_key(name, namespace=namespace)
    except pgsolo.InvalidKeyError:
        assert expected_key(name) is None or expected_key((namespace, 0)) is None
    else:
        assert isinstance(key.value, tuple)
        assert key.value[0] == namespace
        assert key.name == name


@fuzz(80)
@given(KEYS)
def test_a_session_lock_on_any_key_is_taken_and_released_or_refused_before_any_sql(
    dsn: str, observer: Any, value: Any
) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        lock_any_session_key(conn, observer, value)


def lock_any_session_key(conn: psycopg.Connection[Any], observer: Any, value: object) -> None:
    expected = expected_key(value)
    if expected is None:
        with nothing_sent(conn, observer), pytest.raises(pgsolo.UsageError):
            pgsolo.session_lock(conn, value)
    else:
        with pgsolo.session_lock(conn, value) as lock:
            assert lock.acquired
            assert observer.advisory(pid=conn.info.backend_pid) == {expected}
    assert_clean(conn, observer)


@fuzz(60)
@given(KEYS, st.booleans())
def test_a_transaction_lock_on_any_key_is_taken_and_released_or_refused_before_any_sql(
    dsn: str, observer: Any, value: Any, in_callers_transaction: bool
) -> None:
    """In pgsolo's own transaction or in the caller's: a refused key leaves the caller's
    transaction as it was (not aborted, nothing sent)."""
    with psycopg.connect(dsn, autocommit=not in_callers_transaction) as conn:
        lock_any_xact_key(conn, observer, value)


def lock_any_xact_key(conn: psycopg.Connection[Any], observer: Any, value: object) -> None:
    in_callers_transaction = not conn.autocommit
    expected = expected_key(value)
    if expected is None:
        with nothing_sent(conn, observer), pytest.raises(pgsolo.UsageError):
            pgsolo.xact_lock(conn, value)
    else:
        with pgsolo.xact_lock(conn, value, wait=5) as lock:
            assert lock.acquired
            assert observer.advisory(pid=conn.info.backend_pid) == {expected}
    if in_callers_transaction:
        conn.rollback()
    assert_clean(conn, observer)
