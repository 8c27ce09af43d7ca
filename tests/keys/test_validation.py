"""What is not a key is refused, with an error that is both a ``ValueError`` and a usage
error: int64 and int32 bounds, pairs that are tuples of exactly two real ints, names
(empty, NUL, over 1024 UTF-8 bytes, lone surrogates) and namespaces.
"""

from __future__ import annotations

import enum

import pytest

import pgsolo
from _support import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from pgsolo.errors import InvalidKeyError, KeyCollisionError, UsageError
from pgsolo.keys import (
    Key,
    Registry,
    as_key,
    derive_int32,
    derive_int64,
    from_name,
    leader_key,
    semaphore_keys,
)
from pgsolo.once.operation import idempotency_key_for, lock_key_for
from pgsolo.sql import name_to_sql


def test_invalid_key_error_is_a_value_error_and_a_usage_error() -> None:
    assert issubclass(InvalidKeyError, ValueError)
    assert issubclass(InvalidKeyError, UsageError)
    assert issubclass(KeyCollisionError, ValueError)


@pytest.mark.parametrize(
    "bad",
    [
        True,
        False,
        1.0,
        3.5,
        None,
        b"daily-settlement",
        bytearray(b"x"),
        pytest.param(object(), id="object()"),  # its repr holds an address: another each run
        {1: 2},
    ],
    ids=repr,
)
def test_as_key_rejects_values_that_are_not_keys(bad: object) -> None:
    with pytest.raises(InvalidKeyError):
        as_key(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # noqa: PT011 - the ValueError contract itself
        as_key(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, False, 1.0, None, b"1"], ids=repr)
def test_key_constructor_rejects_values_that_are_not_ints(bad: object) -> None:
    with pytest.raises(InvalidKeyError):
        Key(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, 2**64, -(2**100)])
def test_int64_out_of_range_is_rejected(bad: int) -> None:
    with pytest.raises(InvalidKeyError, match="int64"):
        as_key(bad)
    with pytest.raises(InvalidKeyError):
        Key(bad)


@pytest.mark.parametrize("good", [INT64_MAX, INT64_MIN, 0, -1, 1])
def test_int64_boundaries_are_accepted(good: int) -> None:
    key = as_key(good)
    assert key.value == good
    assert not key.is_pair


@pytest.mark.parametrize(
    "pair",
    [
        (INT32_MAX + 1, 0),
        (0, INT32_MAX + 1),
        (INT32_MIN - 1, 0),
        (0, INT32_MIN - 1),
        (2**40, 1),
    ],
)
def test_pair_halves_out_of_int32_range_are_rejected(pair: tuple[int, int]) -> None:
    with pytest.raises(InvalidKeyError, match="pair"):
        as_key(pair)
    with pytest.raises(InvalidKeyError):
        Key(pair)


def test_pair_int32_boundaries_are_accepted() -> None:
    assert as_key((INT32_MIN, INT32_MAX)).value == (INT32_MIN, INT32_MAX)
    assert as_key((INT32_MAX, INT32_MIN)).value == (INT32_MAX, INT32_MIN)


@pytest.mark.parametrize("bad", [[42, 1001], [1, 2, 3], [], range(2), bytearray(b"ab")], ids=repr)
def test_a_pair_is_a_tuple_never_a_list_or_other_sequence(bad: object) -> None:
    """Guards: ``as_key([1, 2])`` was taken as a pair. A pair is a tuple only, and the
    error says how to pass one."""
    for make in (as_key, Key):
        with pytest.raises(InvalidKeyError) as refused:
            make(bad)  # type: ignore[operator]
        if not isinstance(bad, bytearray):
            assert "tuple(value)" in str(refused.value)
    assert as_key(tuple([42, 1001])).value == (42, 1001)


def test_a_list_key_is_refused_before_any_sql(connect, observer) -> None:
    conn = connect()
    for attempt in (
        lambda: pgsolo.session_lock(conn, [42, 1001]),  # type: ignore[call-overload]
        lambda: pgsolo.xact_lock(conn, [42, 1001]),  # type: ignore[call-overload]
        lambda: pgsolo.run_job(conn, [42, 1001], lambda c: None),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidKeyError, match=r"tuple\(value\)"):
            attempt()
    row = observer.conn.execute(
        "SELECT query FROM pg_stat_activity WHERE pid = %s", (conn.info.backend_pid,)
    ).fetchone()
    assert row == ("",)  # nothing was ever sent on it


@pytest.mark.parametrize("bad", [(1, 2, 3), (1,), ()], ids=repr)
def test_pair_must_have_exactly_two_parts(bad: object) -> None:
    with pytest.raises(InvalidKeyError, match="two parts"):
        as_key(bad)  # type: ignore[arg-type]


def test_key_constructor_rejects_three_part_tuple() -> None:
    with pytest.raises(InvalidKeyError, match="two parts"):
        Key((1, 2, 3))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad", [(True, False), (True, 1), (1, False), (1.0, 2), (1, "2"), (None, 1)], ids=repr
)
def test_pair_halves_must_be_real_ints(bad: tuple[object, object]) -> None:
    with pytest.raises(InvalidKeyError):
        as_key(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        Key(bad)  # type: ignore[arg-type]


def test_a_numeric_key_used_again_is_the_same_key_and_a_refusal_stays_a_refusal() -> None:
    """Guards the cache of numeric keys (a program locks the same few over and over): the
    same int or pair gives the same key, and nothing cached lets through what equals a
    cached key without being one (True == 1, 1.0 == 1, an int subclass), nor a key out of
    range that was once asked for."""
    assert as_key((7, 8)) is as_key((7, 8))
    assert as_key(7) is as_key(7)
    for bad in ((True, 8), (7.0, 8), (7, False), True, 7.0, (7, 8, 9), [7, 8]):
        with pytest.raises(InvalidKeyError):
            as_key(bad)  # type: ignore[arg-type]

    class Tenant(int):
        pass

    assert as_key(Tenant(7)) == as_key(7)  # an int subclass is still an int key...
    assert as_key(Tenant(7)) is not as_key(7)  # ...validated as given, not looked up,
    assert type(as_key(Tenant(7)).value) is int  # and held as the plain int it holds
    for _ in range(2):
        with pytest.raises(InvalidKeyError):
            as_key((7, INT32_MAX + 1))
        with pytest.raises(InvalidKeyError):
            as_key(INT64_MAX + 1)


def test_empty_name_is_rejected() -> None:
    with pytest.raises(InvalidKeyError, match="empty"):
        as_key("")
    with pytest.raises(InvalidKeyError):
        derive_int64("")


def test_name_with_nul_is_rejected() -> None:
    with pytest.raises(InvalidKeyError, match="NUL"):
        as_key("before\0after")
    with pytest.raises(InvalidKeyError):
        derive_int32("\0")


def test_name_of_exactly_1024_bytes_is_accepted() -> None:
    name = "a" * 1024
    assert as_key(name).value == derive_int64(name)


def test_name_over_1024_bytes_is_rejected() -> None:
    with pytest.raises(InvalidKeyError, match="1024"):
        as_key("a" * 1025)


def test_name_limit_counts_utf8_bytes_not_characters() -> None:
    # "ü" is two UTF-8 bytes: 512 of them are 1024 bytes, 513 are 1026 bytes.
    exact = "ü" * 512
    assert len(exact) == 512
    assert len(exact.encode("utf-8")) == 1024
    assert as_key(exact).value == derive_int64(exact)

    over = "ü" * 513
    assert len(over) < 1024
    with pytest.raises(InvalidKeyError, match="1026"):
        as_key(over)


def test_name_limit_with_mixed_widths_and_four_byte_characters() -> None:
    exact = "🔒" * 255 + "abcd"  # 255 * 4 + 4 = 1024 bytes, 259 characters
    assert len(exact.encode("utf-8")) == 1024
    assert from_name(exact).name == exact
    with pytest.raises(InvalidKeyError):
        from_name(exact + "x")


@pytest.mark.parametrize("bad", ["\ud800", "ok\udfffok", "\udc80 trailing"], ids=repr)
def test_name_with_lone_surrogate_is_rejected(bad: str) -> None:
    with pytest.raises(InvalidKeyError, match="Unicode"):
        as_key(bad)
    with pytest.raises(InvalidKeyError):
        name_to_sql(bad)


def test_key_name_is_validated_too() -> None:
    with pytest.raises(InvalidKeyError):
        Key(1, "")
    with pytest.raises(InvalidKeyError):
        Key(1, "\0")


@pytest.mark.parametrize("numeric", [5, -5, (42, 1001), [42, 1001]], ids=repr)
def test_namespace_with_a_numeric_key_is_rejected(numeric: object) -> None:
    with pytest.raises(InvalidKeyError, match="namespace"):
        as_key(numeric, namespace=42)  # type: ignore[arg-type]


@pytest.mark.parametrize("namespace", [True, 1.5, INT32_MAX + 1, INT32_MIN - 1])
def test_bad_namespace_for_a_name_is_rejected(namespace: object) -> None:
    with pytest.raises(InvalidKeyError, match="namespace"):
        as_key("daily-settlement", namespace=namespace)  # type: ignore[arg-type]


class _Lying(int):
    """An int whose own methods say another number than the one it holds."""

    def __int__(self) -> int:
        return 2**70

    def __index__(self) -> int:
        return 2**70

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return False


def test_an_int_subclass_key_is_the_plain_int_it_holds() -> None:
    """Guards the statements cached by key: an int subclass checked by its own methods
    went into the SQL by its __int__ (an out-of-range number the server refused), and the
    statement cached for its value then failed every later lock of the plain int."""
    key = pgsolo.as_key(_Lying(5))
    assert type(key.value) is int
    assert key.value == 5
    assert key.sql_args == "5"
    pair = Key((_Lying(42), _Lying(7)))
    assert [type(part) for part in pair.value] == [int, int]  # type: ignore[union-attr]
    assert pair.sql_args == "42, 7"
    with pytest.raises(InvalidKeyError):
        Key(_Lying(2**70))  # the number it holds is checked, not what it says of itself


class _Job(str, enum.Enum):  # noqa: UP042 - as users write it: its str() is not its value
    SCHEDULER = "scheduler"


class _Shouting(str):
    """A str whose methods say something else than the characters it holds."""

    def __str__(self) -> str:
        return self.upper()

    def __format__(self, spec: str) -> str:
        return self.upper()

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"shouted"


@pytest.mark.parametrize("name", [_Job.SCHEDULER, _Shouting("scheduler")])
def test_a_str_subclass_name_is_the_plain_str_it_holds(name: str) -> None:
    """Guards the keys made of a name: checked by its value, a (str, Enum) member was
    hashed by its str() in leader, semaphore and run_once keys ("pgsolo:leader:_Job.
    SCHEDULER"), so that two leaders led at once, one by the member and one by its value,
    and an operation ran twice under two idempotency keys."""
    assert name == "scheduler"
    assert as_key(name) == as_key("scheduler")
    assert type(as_key(name).name) is str
    assert leader_key(name) == leader_key("scheduler")
    assert semaphore_keys(name, 3) == semaphore_keys("scheduler", 3)
    assert lock_key_for(name) == lock_key_for("scheduler")
    assert idempotency_key_for(name) == idempotency_key_for("scheduler")
    assert as_key(name, registry=Registry({"scheduler": 77})) == Key(77, "scheduler")
    assert as_key("scheduler", registry=Registry({name: 77})) == Key(77, "scheduler")


@pytest.mark.parametrize("registry", ["locks.toml", {}, 5])
def test_a_registry_that_is_not_one_is_refused(registry: object) -> None:
    """Guards the typed error: an AttributeError of `.resolve` came out of every lock."""
    with pytest.raises(pgsolo.InvalidArgumentError, match="Registry"):
        as_key("daily-settlement", registry=registry)  # type: ignore[arg-type]
