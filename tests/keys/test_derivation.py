"""Keys derived from names (key spec v1): the spec's test vectors in Python and on the
server, UTF-8 bytes rather than code points, a derivation that never depends on Python's
hash, the SQL expression of ``name_to_sql`` (the DESIGN document's own, safe whatever the
server's quoting settings), and names at the byte limit derived the same in SQL.
"""

from __future__ import annotations

import psycopg
import pytest

from _support import INT32_MAX, INT32_MIN, VECTORS
from pgsolo.errors import InvalidKeyError
from pgsolo.keys import (
    derive_int32,
    derive_int64,
    from_name,
)
from pgsolo.sql import name_to_sql

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


def sql_scalar(conn: psycopg.Connection, expression: str) -> object:
    row = conn.execute(f"SELECT {expression}").fetchone()
    assert row is not None
    return row[0]


def sql_row(conn: psycopg.Connection, expression: str) -> tuple[object, ...]:
    row = conn.execute(f"SELECT {expression}").fetchone()
    assert row is not None
    return tuple(row)


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


def test_a_name_derived_again_is_the_same_key_and_a_refusal_stays_a_refusal() -> None:
    """Guards the cache of derived keys (a program locks the same names over and over):
    the same name gives the same key, and nothing cached lets a bad argument through, or
    a namespace of True where 1 was derived. A str subclass is the plain str it holds
    (test_a_str_subclass_name_is_the_plain_str_it_holds)."""
    first = from_name("cached-name", namespace=1)
    assert from_name("cached-name", namespace=1) is first
    with pytest.raises(InvalidKeyError, match="namespace"):
        from_name("cached-name", namespace=True)
    with pytest.raises(InvalidKeyError, match="namespace"):
        from_name("cached-name", namespace=[1])  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError, match="str"):
        from_name(["cached-name"])  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(InvalidKeyError, match="empty"):
            from_name("")

    class Label(str):
        pass

    labelled = from_name(Label("cached-name"), namespace=1)
    assert labelled is first
    assert type(labelled.name) is str


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


def test_name_of_1024_bytes_derives_the_same_in_sql(conn) -> None:
    name = "ü" * 500 + "'" * 24  # 1000 + 24 bytes, with quotes that double in SQL
    assert len(name.encode("utf-8")) == 1024
    assert sql_scalar(conn, name_to_sql(name)) == derive_int64(name)
