"""The ``Key`` object: ``as_key``, ``Key.parse`` (numeric forms, names, round trips through
text), its SQL arguments and text, presentation, equality, hashing and immutability.
"""

from __future__ import annotations

import pytest

import pgsolo
from _support import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN
from pgsolo.errors import InvalidKeyError
from pgsolo.keys import (
    Key,
    as_key,
    derive_int32,
    derive_int64,
    from_name,
)


def test_as_key_with_a_name_and_namespace_derives_a_pair() -> None:
    assert as_key("daily-settlement", namespace=42).value == (42, -589975127)
    assert as_key("daily-settlement").value == -2533923874772390729


def test_as_key_returns_a_key_unchanged() -> None:
    key = Key((1, 2), "n")
    assert as_key(key) is key


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("123", 123),
        ("-5", -5),
        ("+7", 7),
        ("0", 0),
        (str(INT64_MAX), INT64_MAX),
        (str(INT64_MIN), INT64_MIN),
        ("42:1001", (42, 1001)),
        ("-1:-2", (-1, -2)),
        (f"{INT32_MIN}:{INT32_MAX}", (INT32_MIN, INT32_MAX)),
    ],
)
def test_parse_numeric_forms(text: str, value: int | tuple[int, int]) -> None:
    key = Key.parse(text)
    assert key.value == value
    assert key.name is None


@pytest.mark.parametrize(
    "text",
    ["x:y", "daily-settlement", ":1001", "tenant:42", "12a", "1.5", "١٢٣", "1_000", "a b"],
)
def test_parse_anything_else_is_a_name(text: str) -> None:
    key = Key.parse(text)
    assert key.value == derive_int64(text)
    assert key.name == text


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("42:abc", "42:1001"),
        ("42:1001:3", "42:1001"),
        ("1:2:3", "1:2"),
        ("42:", "42:1001"),
        ("-7: 9", "-7:9"),
        ("42 :1001", "42:1001"),
        (" spaced ", "'spaced'"),
        (" 5", "'5'"),
        ("daily-settlement\n", "'daily-settlement'"),
        ("\t42:1001", "'42:1001'"),
    ],
    ids=repr,
)
def test_parse_refuses_what_is_a_name_only_by_mistake(text: str, accepted: str) -> None:
    """A malformed pair, or blanks around the text, would lock a key nobody meant: the
    error says what would be accepted, and how to lock the text as a name after all."""
    with pytest.raises(InvalidKeyError) as raised:
        Key.parse(text)
    assert accepted in str(raised.value)
    assert "--key-is-name" in str(raised.value)
    key = Key.parse(text, name=True)  # the text as a name, exactly as given (DESIGN §2)
    assert (key.value, key.name) == (derive_int64(text), text)
    assert pgsolo.as_key(text) == key  # in Python a str is always a name


def test_parse_as_a_name_never_reads_numbers() -> None:
    assert Key.parse("42:1001", name=True).value == derive_int64("42:1001")
    assert Key.parse("123", name=True, namespace=7).value == (7, derive_int32("123"))


def test_parse_name_is_the_spec_vector() -> None:
    assert Key.parse("daily-settlement").value == -2533923874772390729


def test_parse_name_with_namespace_is_a_pair() -> None:
    key = Key.parse("daily-settlement", namespace=42)
    assert key.value == (42, -589975127)
    assert key.name == "daily-settlement"
    assert Key.parse("x:y", namespace=9).value == (9, derive_int32("x:y"))


@pytest.mark.parametrize("text", [str(2**63), str(-(2**63) - 1), "2147483648:1", "1:-2147483649"])
def test_parse_numeric_out_of_range_is_rejected(text: str) -> None:
    with pytest.raises(InvalidKeyError):
        Key.parse(text)


@pytest.mark.parametrize("text", ["", "a\0b"], ids=repr)
def test_parse_invalid_name_is_rejected(text: str) -> None:
    with pytest.raises(InvalidKeyError):
        Key.parse(text)


@pytest.mark.parametrize("bad", [123, None, b"123", (1, 2)], ids=repr)
def test_parse_requires_a_str(bad: object) -> None:
    with pytest.raises(InvalidKeyError, match="str"):
        Key.parse(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["123", "-5", "42:1001", "-1:-2", str(INT64_MIN)])
def test_parse_round_trips_through_text(text: str) -> None:
    assert Key.parse(text).text == text
    assert Key.parse(Key.parse(text).text) == Key.parse(text)


def test_sql_args_of_int64_and_pair() -> None:
    assert Key(123).sql_args == "123"
    assert Key(INT64_MIN).sql_args == "-9223372036854775808"
    assert Key((42, 1001)).sql_args == "42, 1001"
    assert Key((-1, -2)).sql_args == "-1, -2"


def test_text_of_int64_and_pair() -> None:
    assert Key(-5).text == "-5"
    assert Key((42, 1001)).text == "42:1001"
    assert Key((-1, -2)).text == "-1:-2"
    assert from_name("daily-settlement").text == "-2533923874772390729"


def test_str_shows_the_name_when_there_is_one() -> None:
    assert str(Key(7)) == "7"
    assert str(Key((42, 1001))) == "42:1001"
    assert str(from_name("daily-settlement", namespace=42)) == "daily-settlement (42:-589975127)"
    assert str(Key(7, "seven")) == "seven (7)"


def test_equality_ignores_the_name() -> None:
    assert Key(7, "a") == Key(7, "b") == Key(7)
    assert Key((1, 2), "a") == Key((1, 2))
    assert from_name("daily-settlement") == Key(-2533923874772390729)


def test_int64_and_pair_key_spaces_never_compare_equal() -> None:
    assert Key(1) != Key((0, 1))
    assert Key(0) != Key((0, 0))
    assert Key((1, 2)) != Key((2, 1))


def test_keys_are_hashable_and_hash_ignores_the_name() -> None:
    assert hash(Key(7, "a")) == hash(Key(7, "b"))
    assert len({Key(7, "a"), Key(7, "b"), Key(7), Key((0, 7)), Key((7, 0))}) == 3
    lookup = {Key((42, 1001)): "job"}
    assert lookup[Key((42, 1001), "daily")] == "job"


def test_keys_are_immutable() -> None:
    key = Key(7)
    with pytest.raises(AttributeError):
        key.value = 8  # type: ignore[misc]
