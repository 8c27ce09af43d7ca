"""Key spec v1 (DESIGN.md §2): validation, derivation, SQL parity, pg_locks decoding, registry.

Derivations are checked against the normative test vectors both in Python and on a real
PostgreSQL server; ``pg_locks`` decoding is checked by taking real advisory locks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgsolo
from pgsolo.errors import InvalidKeyError, KeyCollisionError, UsageError
from pgsolo.keys import (
    Key,
    Registry,
    as_key,
    decode_pg_lock,
    derive_int32,
    derive_int64,
    encode_pg_lock,
    from_name,
)
from pgsolo.sql import name_to_sql

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# DESIGN.md §2, normative: name -> (int64 key, int32 half).
VECTORS = {
    "daily-settlement": (-2533923874772390729, -589975127),
    "expired-session-cleanup": (1464048641933150878, 340875387),
    "tenant-export": (-4731608009049143110, -1101663339),
    "Grüße": (-559005354142841542, -130153577),
}
VECTOR_NAMES = list(VECTORS)

# Names that are awkward to quote in SQL; each must derive identically on the server.
AWKWARD_NAMES = [
    "o'clock",
    "''",
    "'; SELECT 1; --",
    "a\\b",
    "trailing\\",
    "x\\'; SELECT pg_sleep(10); --",
    "100%",
    "%s and %(x)s",
    "$$dollar$$",
    'double"quote',
    "new\nline\ttab",
    "emoji 🔒 lock",
]


@pytest.fixture
def conn(connect) -> psycopg.Connection:
    return connect()


def sql_scalar(conn: psycopg.Connection, expression: str) -> object:
    row = conn.execute(f"SELECT {expression}").fetchone()
    assert row is not None
    return row[0]


def sql_row(conn: psycopg.Connection, expression: str) -> tuple[object, ...]:
    row = conn.execute(f"SELECT {expression}").fetchone()
    assert row is not None
    return tuple(row)


# --- test vectors, in Python -----------------------------------------------------------


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_derive_int64_matches_the_spec_vector(name: str) -> None:
    assert derive_int64(name) == VECTORS[name][0]


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_derive_int32_matches_the_spec_vector(name: str) -> None:
    assert derive_int32(name) == VECTORS[name][1]


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_from_name_builds_an_int64_key_carrying_the_name(name: str) -> None:
    key = from_name(name)
    assert key.value == VECTORS[name][0]
    assert key.name == name
    assert not key.is_pair


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_from_name_with_namespace_builds_a_pair_key(name: str) -> None:
    key = from_name(name, namespace=42)
    assert key.value == (42, VECTORS[name][1])
    assert key.name == name
    assert key.is_pair


def test_int32_half_is_the_top_half_of_the_int64_key() -> None:
    for int64, int32 in VECTORS.values():
        assert int64 >> 32 == int32


def test_derivation_uses_utf8_bytes_not_code_points() -> None:
    # "Grüße" precomposed vs decomposed (u + combining diaeresis) are different bytes.
    decomposed = "Gru\u0308ße"
    assert derive_int64(decomposed) != VECTORS["Grüße"][0]


def test_derivation_is_stable_and_not_python_hash() -> None:
    assert derive_int64("daily-settlement") == derive_int64("daily-settlement")
    assert derive_int64("daily-settlement") != hash("daily-settlement")


# --- test vectors, on the server -------------------------------------------------------


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_name_to_sql_int64_matches_the_spec_vector_on_the_server(conn, name: str) -> None:
    assert sql_scalar(conn, name_to_sql(name)) == VECTORS[name][0]


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_name_to_sql_pair_matches_the_spec_vector_on_the_server(conn, name: str) -> None:
    assert sql_row(conn, name_to_sql(name, namespace=42)) == (42, VECTORS[name][1])


@pytest.mark.parametrize("namespace", [INT32_MIN, -1, 0, INT32_MAX])
def test_name_to_sql_pair_keeps_extreme_namespaces(conn, namespace: int) -> None:
    expected = (namespace, VECTORS["tenant-export"][1])
    assert sql_row(conn, name_to_sql("tenant-export", namespace=namespace)) == expected


@pytest.mark.parametrize("name", VECTOR_NAMES)
def test_design_doc_literal_sql_gives_the_spec_vector(conn, name: str) -> None:
    literal = name.replace("'", "''")
    int64 = sql_scalar(
        conn,
        f"('x' || substr(encode(sha256(convert_to('{literal}', 'UTF8')), 'hex'), 1, 16))"
        "::bit(64)::bigint",
    )
    pair = sql_row(
        conn,
        f"42, ('x' || substr(encode(sha256(convert_to('{literal}','UTF8')),'hex'),1,8))"
        "::bit(32)::int",
    )
    assert int64 == VECTORS[name][0]
    assert pair == (42, VECTORS[name][1])


def test_design_doc_example_is_the_daily_settlement_vector(conn) -> None:
    value = sql_scalar(
        conn,
        "('x' || substr(encode(sha256(convert_to('daily-settlement', 'UTF8')), 'hex'), 1, 16))"
        "::bit(64)::bigint",
    )
    assert value == -2533923874772390729


# --- SQL injection safety of name_to_sql -----------------------------------------------


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_name_to_sql_derives_awkward_names_like_python(conn, name: str) -> None:
    assert sql_scalar(conn, name_to_sql(name)) == derive_int64(name)
    assert sql_row(conn, name_to_sql(name, namespace=-7)) == (-7, derive_int32(name))


@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_name_to_sql_is_safe_without_standard_conforming_strings(conn, name: str) -> None:
    # psql users may run with standard_conforming_strings = off, where '\' escapes.
    conn.execute("SET standard_conforming_strings = off")
    conn.execute("SET escape_string_warning = off")
    assert sql_scalar(conn, name_to_sql(name)) == derive_int64(name)
    assert sql_row(conn, name_to_sql(name, namespace=3)) == (3, derive_int32(name))


def test_name_to_sql_of_a_plain_name_is_the_design_doc_expression() -> None:
    assert name_to_sql("daily-settlement") == (
        "('x' || substr(encode(sha256(convert_to('daily-settlement', 'UTF8')), 'hex'), 1, 16))"
        "::bit(64)::bigint"
    )
    assert name_to_sql("daily-settlement", namespace=42) == (
        "42, ('x' || substr(encode(sha256(convert_to('daily-settlement', 'UTF8')), 'hex'), 1, 8))"
        "::bit(32)::int"
    )


def test_name_to_sql_with_a_quote_is_one_expression(conn) -> None:
    # If the quote escaped the literal, the extra statement would run or break parsing.
    name = "x'); SELECT 'pwned"
    rows = conn.execute(f"SELECT {name_to_sql(name)}").fetchall()
    assert rows == [(derive_int64(name),)]


def test_name_to_sql_validates_the_name_first() -> None:
    with pytest.raises(InvalidKeyError):
        name_to_sql("")
    with pytest.raises(InvalidKeyError):
        name_to_sql("nul\0byte")
    with pytest.raises(InvalidKeyError):
        name_to_sql("x" * 1025)


@pytest.mark.parametrize("namespace", [True, 1.0, INT32_MAX + 1, INT32_MIN - 1, "42"])
def test_name_to_sql_rejects_a_bad_namespace(namespace: object) -> None:
    with pytest.raises(InvalidKeyError):
        name_to_sql("daily-settlement", namespace=namespace)  # type: ignore[arg-type]


# --- validation ------------------------------------------------------------------------


def test_invalid_key_error_is_a_value_error_and_a_usage_error() -> None:
    assert issubclass(InvalidKeyError, ValueError)
    assert issubclass(InvalidKeyError, UsageError)
    assert issubclass(KeyCollisionError, ValueError)


@pytest.mark.parametrize(
    "bad",
    [True, False, 1.0, 3.5, None, b"daily-settlement", bytearray(b"x"), object(), {1: 2}],
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


def test_name_of_1024_bytes_derives_the_same_in_sql(conn) -> None:
    name = "ü" * 500 + "'" * 24  # 1000 + 24 bytes, with quotes that double in SQL
    assert len(name.encode("utf-8")) == 1024
    assert sql_scalar(conn, name_to_sql(name)) == derive_int64(name)


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


def test_as_key_with_a_name_and_namespace_derives_a_pair() -> None:
    assert as_key("daily-settlement", namespace=42).value == (42, -589975127)
    assert as_key("daily-settlement").value == -2533923874772390729


def test_as_key_returns_a_key_unchanged() -> None:
    key = Key((1, 2), "n")
    assert as_key(key) is key


# --- Key.parse -------------------------------------------------------------------------


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
    ["x:y", "daily-settlement", "1:2:3", "42:", ":1001", "12a", "1.5", " 5", "١٢٣", "1_000"],
)
def test_parse_anything_else_is_a_name(text: str) -> None:
    key = Key.parse(text)
    assert key.value == derive_int64(text)
    assert key.name == text


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


# --- Key presentation, equality, hashing -----------------------------------------------


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


# --- decode_pg_lock --------------------------------------------------------------------

ROUND_TRIP_KEYS = [
    Key(0),
    Key(1),
    Key(-1),
    Key(INT64_MIN),
    Key(INT64_MAX),
    Key(2**32),
    Key(-(2**32)),
    Key(2**31),
    *(Key(int64, name) for name, (int64, _) in VECTORS.items()),
    Key((-1, -1)),
    Key((INT32_MIN, INT32_MAX)),
    Key((INT32_MAX, INT32_MIN)),
    Key((0, 0)),
    *(Key((42, int32), name) for name, (_, int32) in VECTORS.items()),
]


@pytest.fixture
def locker(connect) -> Iterator[psycopg.Connection]:
    conn = connect()
    yield conn
    conn.execute("SELECT pg_advisory_unlock_all()")


def locks_of(observer, pid: int) -> list[tuple[int, int, int]]:
    rows = observer.conn.execute(
        "SELECT classid::bigint, objid::bigint, objsubid::int FROM pg_locks"
        " WHERE locktype = 'advisory' AND granted AND pid = %s",
        (pid,),
    ).fetchall()
    return [(int(c), int(o), int(s)) for c, o, s in rows]


@pytest.mark.parametrize("key", ROUND_TRIP_KEYS, ids=lambda k: k.text)
def test_decode_pg_lock_round_trips_a_real_lock(locker, observer, key: Key) -> None:
    locker.execute(f"SELECT pg_advisory_lock({key.sql_args})")
    rows = locks_of(observer, locker.info.backend_pid)
    assert len(rows) == 1
    classid, objid, objsubid = rows[0]
    assert objsubid == (2 if key.is_pair else 1)
    assert 0 <= classid < 2**32
    assert 0 <= objid < 2**32
    assert encode_pg_lock(key) == (classid, objid, objsubid)
    decoded = decode_pg_lock(classid, objid, objsubid)
    assert decoded == key
    assert decoded.value == key.value
    assert decoded.is_pair == key.is_pair

    locker.execute(f"SELECT pg_advisory_unlock({key.sql_args})")
    assert locks_of(observer, locker.info.backend_pid) == []


def test_decode_pg_lock_of_a_name_derived_in_sql(locker, observer) -> None:
    locker.execute(f"SELECT pg_advisory_lock({name_to_sql('daily-settlement')})")
    locker.execute(f"SELECT pg_advisory_lock({name_to_sql('tenant-export', namespace=42)})")
    decoded = {decode_pg_lock(*row) for row in locks_of(observer, locker.info.backend_pid)}
    assert decoded == {from_name("daily-settlement"), from_name("tenant-export", namespace=42)}


def test_decode_pg_lock_tells_int64_from_pair_with_the_same_numbers(locker, observer) -> None:
    locker.execute("SELECT pg_advisory_lock(1)")
    locker.execute("SELECT pg_advisory_lock(0, 1)")
    decoded = {decode_pg_lock(*row) for row in locks_of(observer, locker.info.backend_pid)}
    assert decoded == {Key(1), Key((0, 1))}


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ((0, 0, 1), Key(0)),
        ((0, 1, 1), Key(1)),
        ((0xFFFFFFFF, 0xFFFFFFFF, 1), Key(-1)),
        ((0x80000000, 0, 1), Key(INT64_MIN)),
        ((0x7FFFFFFF, 0xFFFFFFFF, 1), Key(INT64_MAX)),
        ((1, 0, 1), Key(2**32)),
        ((0xFFFFFFFF, 0, 1), Key(-(2**32))),
        ((42, 1001, 2), Key((42, 1001))),
        ((0xFFFFFFFF, 0xFFFFFFFE, 2), Key((-1, -2))),
        ((0x80000000, 0x7FFFFFFF, 2), Key((INT32_MIN, INT32_MAX))),
        ((0, 0, 2), Key((0, 0))),
    ],
)
def test_decode_pg_lock_unit_cases(row: tuple[int, int, int], expected: Key) -> None:
    decoded = decode_pg_lock(*row)
    assert decoded.value == expected.value
    assert encode_pg_lock(expected) == row


@pytest.mark.parametrize("objsubid", [0, 3, -1, 4])
def test_decode_pg_lock_rejects_a_non_advisory_objsubid(objsubid: int) -> None:
    with pytest.raises(InvalidKeyError, match="objsubid"):
        decode_pg_lock(1, 2, objsubid)


@pytest.mark.parametrize("row", [(-1, 0, 1), (0, -1, 1), (-1, -2, 2), (2**32, 0, 1), (0, 2**32, 2)])
def test_decode_pg_lock_rejects_oids_outside_uint32(row: tuple[int, int, int]) -> None:
    with pytest.raises(InvalidKeyError, match="unsigned"):
        decode_pg_lock(*row)


@pytest.mark.parametrize("row", [(True, 0, 1), (0, 1.0, 1), (None, 0, 1), ("1", 0, 1)])
def test_decode_pg_lock_rejects_oids_that_are_not_ints(row: tuple[object, ...]) -> None:
    with pytest.raises(InvalidKeyError):
        decode_pg_lock(*row)  # type: ignore[arg-type]


# --- Registry --------------------------------------------------------------------------


def test_registry_register_and_resolve() -> None:
    registry = Registry()
    key = registry.register("daily-settlement", (42, 1001))
    assert key == Key((42, 1001))
    assert key.name == "daily-settlement"
    resolved = registry.resolve("daily-settlement")
    assert resolved.value == (42, 1001)
    assert resolved.name == "daily-settlement"
    assert "daily-settlement" in registry
    assert len(registry) == 1
    assert registry.items() == [("daily-settlement", Key((42, 1001)))]


def test_registry_registered_name_wins_over_derivation_and_namespace() -> None:
    registry = Registry({"daily-settlement": 7})
    assert registry.resolve("daily-settlement").value == 7
    assert registry.resolve("daily-settlement", namespace=42).value == 7


def test_registry_accepts_a_key_object() -> None:
    registry = Registry()
    key = registry.register("cache-refresh", Key(7, "other-label"))
    assert key.value == 7
    assert key.name == "cache-refresh"
    assert registry.name_of(Key(7)) == "cache-refresh"


def test_registry_registering_the_same_name_and_key_twice_is_harmless() -> None:
    registry = Registry()
    first = registry.register("job", (42, 1))
    second = registry.register("job", (42, 1))
    assert first == second == Key((42, 1))
    assert len(registry) == 1


def test_registry_refuses_a_list_as_a_pair_in_code() -> None:
    """A TOML array is read as a pair (TOML has no tuples); in code a pair is a tuple."""
    with pytest.raises(InvalidKeyError, match=r"tuple\(value\)"):
        Registry().register("job", [42, 1])  # type: ignore[arg-type]


def test_registry_one_name_on_two_keys_is_a_collision() -> None:
    registry = Registry({"job": 1})
    with pytest.raises(KeyCollisionError, match="job"):
        registry.register("job", 2)
    assert registry.resolve("job").value == 1


def test_registry_two_names_on_one_key_is_a_collision() -> None:
    registry = Registry({"first": (42, 1)})
    with pytest.raises(KeyCollisionError, match="first"):
        registry.register("second", (42, 1))
    assert "second" not in registry


def test_registry_collision_detected_in_constructor() -> None:
    with pytest.raises(KeyCollisionError):
        Registry({"a": 5, "b": 5})


def test_registry_int64_and_pair_with_same_numbers_do_not_collide() -> None:
    registry = Registry({"int64": 1, "pair": (0, 1)})
    assert registry.name_of(Key(1)) == "int64"
    assert registry.name_of(Key((0, 1))) == "pair"


def test_registry_derived_key_equal_to_a_registered_key_is_a_collision() -> None:
    registry = Registry()
    registry.register("squatter", derive_int64("daily-settlement"))
    with pytest.raises(KeyCollisionError, match="squatter"):
        registry.resolve("daily-settlement")
    with pytest.raises(KeyCollisionError):
        as_key("daily-settlement", registry=registry)


def test_registry_derived_pair_equal_to_a_registered_pair_is_a_collision() -> None:
    registry = Registry({"squatter": (42, derive_int32("tenant-export"))})
    with pytest.raises(KeyCollisionError):
        registry.resolve("tenant-export", namespace=42)
    # The same name in another namespace, or as an int64, derives a free key.
    assert registry.resolve("tenant-export", namespace=43).value == (43, -1101663339)
    assert registry.resolve("tenant-export").value == -4731608009049143110


def test_registry_unregistered_name_resolves_to_its_derived_key() -> None:
    registry = Registry({"other": 1})
    key = registry.resolve("expired-session-cleanup")
    assert key.value == 1464048641933150878
    assert key.name == "expired-session-cleanup"
    assert registry.resolve("expired-session-cleanup", namespace=5).value == (5, 340875387)


def test_registry_name_of() -> None:
    registry = Registry({"daily-settlement": (42, 1001), "cache-refresh": -7})
    assert registry.name_of(Key((42, 1001))) == "daily-settlement"
    assert registry.name_of(decode_pg_lock(0xFFFFFFFF, 0xFFFFFFF9, 1)) == "cache-refresh"
    assert registry.name_of(Key((42, 1002))) is None


def test_registry_rejects_invalid_names_and_keys() -> None:
    registry = Registry()
    with pytest.raises(InvalidKeyError):
        registry.register("", 1)
    with pytest.raises(InvalidKeyError):
        registry.register("job", True)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        registry.register("job", 2**63)
    with pytest.raises(InvalidKeyError):
        registry.register("job", (1, 2, 3))  # type: ignore[arg-type]
    assert len(registry) == 0


def test_registry_rejects_a_str_as_the_key_of_a_name() -> None:
    # "42:1001" as a key must not silently become the hash of the string "42:1001".
    registry = Registry()
    with pytest.raises(InvalidKeyError):
        registry.register("job", "42:1001")  # type: ignore[arg-type]
    assert "job" not in registry


def test_registry_namespaces() -> None:
    registry = Registry(namespaces={"jobs": 42, "tenants": -3})
    assert registry.namespace_name(42) == "jobs"
    assert registry.namespace_name(-3) == "tenants"
    assert registry.namespace_name(7) is None
    registry.register_namespace("jobs", 42)  # same again is harmless
    assert registry.namespace_name(42) == "jobs"


def test_registry_namespace_collisions() -> None:
    registry = Registry(namespaces={"jobs": 42})
    with pytest.raises(KeyCollisionError, match="jobs"):
        registry.register_namespace("jobs", 43)
    with pytest.raises(KeyCollisionError, match="42"):
        registry.register_namespace("work", 42)
    assert registry.namespace_name(42) == "jobs"
    assert registry.namespace_name(43) is None


@pytest.mark.parametrize("number", [INT32_MAX + 1, INT32_MIN - 1, True, 1.0])
def test_registry_namespace_must_be_an_int32(number: object) -> None:
    with pytest.raises(InvalidKeyError):
        Registry(namespaces={"jobs": number})  # type: ignore[dict-item]


def test_as_key_uses_the_registry() -> None:
    registry = Registry({"daily-settlement": (42, 1001)})
    key = as_key("daily-settlement", registry=registry)
    assert key.value == (42, 1001)
    assert key.name == "daily-settlement"
    # Unregistered names are still derived.
    assert as_key("tenant-export", registry=registry).value == -4731608009049143110
    # Numeric keys bypass the registry.
    assert as_key(5, registry=registry).value == 5


# --- Registry.from_toml ----------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "locks.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_from_toml_loads_pairs_int64s_and_namespaces(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [namespaces]
        jobs = 42
        tenants = -1

        [locks]
        daily-settlement = [42, 1001]   # a pair
        cache-refresh = 7               # an int64
        "Grüße" = -9223372036854775808
        edge = [-2147483648, 2147483647]
        """,
    )
    registry = Registry.from_toml(path)
    assert len(registry) == 4
    assert registry.resolve("daily-settlement").value == (42, 1001)
    assert registry.resolve("cache-refresh").value == 7
    assert registry.resolve("Grüße").value == INT64_MIN
    assert registry.resolve("edge").value == (INT32_MIN, INT32_MAX)
    assert registry.name_of(Key((42, 1001))) == "daily-settlement"
    assert registry.namespace_name(42) == "jobs"
    assert registry.namespace_name(-1) == "tenants"


def test_from_toml_accepts_a_str_path_and_partial_files(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks]\nonly = 1\n")
    registry = Registry.from_toml(str(path))
    assert registry.resolve("only").value == 1
    assert registry.namespace_name(1) is None
    assert len(Registry.from_toml(write(tmp_path, ""))) == 0


def test_from_toml_registry_still_checks_derived_names(tmp_path: Path) -> None:
    path = write(tmp_path, f"[locks]\nsquatter = {derive_int64('tenant-export')}\n")
    registry = Registry.from_toml(path)
    with pytest.raises(KeyCollisionError, match="squatter"):
        as_key("tenant-export", registry=registry)


def test_from_toml_bad_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks\njob = 1\n")
    with pytest.raises(InvalidKeyError, match="not valid TOML") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


def test_from_toml_duplicate_name_is_bad_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks]\njob = 1\njob = 2\n")
    with pytest.raises(InvalidKeyError) as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


def test_from_toml_unknown_table(tmp_path: Path) -> None:
    path = write(tmp_path, "[lock]\njob = 1\n")
    with pytest.raises(InvalidKeyError, match="unknown tables") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)
    assert "lock" in str(info.value)


def test_from_toml_tables_must_be_tables(tmp_path: Path) -> None:
    path = write(tmp_path, "locks = 5\n")
    with pytest.raises(InvalidKeyError, match="must be tables") as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "9223372036854775808",
        "[2147483648, 1]",
        "[1, -2147483649]",
        "[1, 2, 3]",
        "true",
        "1.5",
        '"42:1001"',
        "{ a = 1 }",
    ],
)
def test_from_toml_invalid_lock_value_names_the_file_and_lock(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[locks]\nbad-job = {value}\n")
    with pytest.raises(InvalidKeyError) as info:
        Registry.from_toml(path)
    assert str(path) in str(info.value)
    assert "bad-job" in str(info.value)


def test_from_toml_collision_in_file_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[locks]\nfirst = [42, 1]\nsecond = [42, 1]\n")
    with pytest.raises(KeyCollisionError) as info:
        Registry.from_toml(path)
    message = str(info.value)
    assert str(path) in message
    assert "first" in message
    assert "second" in message


@pytest.mark.parametrize(
    "namespaces", ["jobs = 2147483648", "jobs = true", 'jobs = "42"', "jobs = 1\nwork = 1"]
)
def test_from_toml_bad_namespaces_name_the_file(tmp_path: Path, namespaces: str) -> None:
    path = write(tmp_path, f"[namespaces]\n{namespaces}\n")
    with pytest.raises(UsageError) as info:
        Registry.from_toml(path)
    assert isinstance(info.value, InvalidKeyError | KeyCollisionError)
    assert str(path) in str(info.value)


def test_from_toml_missing_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Registry.from_toml(tmp_path / "absent.toml")
