"""``pgsolo key``, run for real: checked against the key spec v1 vectors, and the SQL it
prints is run on the test server: it must take the very lock pgsolo computes (pg_locks
says so).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from _support import VECTORS, Connect, json_document, touching
from _support import run_cli as pgsolo
from pgsolo.keys import Key


def key_json(*args: str) -> dict[str, object]:
    done = pgsolo("key", *args, "--json")
    assert done.returncode == 0, done.stderr
    data = json_document(done.stdout)
    assert isinstance(data, dict)
    return data


def test_key_prints_the_spec_vector() -> None:
    done = pgsolo("key", "daily-settlement")
    assert done.returncode == 0, done.stderr
    assert "-2533923874772390729" in done.stdout
    sql_lines = [line for line in done.stdout.splitlines() if line.startswith("SELECT")]
    assert sql_lines == [
        "SELECT pg_try_advisory_lock(('x' || substr(encode(sha256(convert_to("
        "'daily-settlement', 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint);",
        "SELECT pg_try_advisory_lock(-2533923874772390729);",
    ]


def test_key_with_namespace_prints_the_pair() -> None:
    done = pgsolo("key", "daily-settlement", "--namespace", "42")
    assert done.returncode == 0, done.stderr
    assert "42:-589975127" in done.stdout
    assert "SELECT pg_try_advisory_lock(42, -589975127);" in done.stdout.splitlines()


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_key_json_matches_every_vector(name: str) -> None:
    int64, int32 = VECTORS[name]
    info = key_json(name)
    assert {k: v for k, v in info.items() if k != "sql"} == {
        "schema": "pgsolo.key/1",
        "name": name,
        "key": str(int64),
        "namespace": None,
        "resource": None,
        "sql_numeric": f"SELECT pg_try_advisory_lock({int64});",
    }
    assert str(info["sql"]).startswith("SELECT pg_try_advisory_lock(('x' || substr(")
    pair = key_json(name, "--namespace", "42")
    assert (pair["key"], pair["namespace"], pair["resource"]) == (f"42:{int32}", 42, int32)
    assert pair["sql_numeric"] == f"SELECT pg_try_advisory_lock(42, {int32});"


@pytest.mark.parametrize(
    ("name", "namespace"),
    [
        ("daily-settlement", None),
        ("daily-settlement", "42"),
        ("Grüße", None),
        ("it's a \\ test", "-7"),  # quote and backslash must survive into the SQL literal
    ],
)
def test_printed_sql_takes_the_same_lock(
    connect: Connect, observer: Any, name: str, namespace: str | None
) -> None:
    args = [name] if namespace is None else [name, "--namespace", namespace]
    info = key_json(*args)
    expected = Key.parse(name, namespace=None if namespace is None else int(namespace))
    assert info["key"] == expected.text

    holder, other = connect(), connect()
    try:
        row = holder.execute(str(info["sql"])).fetchone()
        assert row == (True,)
        assert observer.advisory(pid=holder.info.backend_pid) == {expected}
        # The numeric form is the same lock: another session finds it taken.
        assert other.execute(str(info["sql_numeric"])).fetchone() == (False,)
    finally:
        holder.execute("SELECT pg_advisory_unlock_all()")
    assert other.execute(str(info["sql_numeric"])).fetchone() == (True,)
    assert observer.advisory(pid=other.info.backend_pid) == {expected}
    other.execute("SELECT pg_advisory_unlock_all()")


def test_derived_sql_expression_computes_the_key(connect: Connect) -> None:
    conn = connect()
    for name, (int64, int32) in VECTORS.items():
        sql = str(key_json(name)["sql"])
        expression = sql.removeprefix("SELECT pg_try_advisory_lock(").removesuffix(");")
        assert conn.execute(f"SELECT {expression}").fetchone() == (int64,)
        pair_sql = str(key_json(name, "--namespace", "42")["sql"])
        pair = pair_sql.removeprefix("SELECT pg_try_advisory_lock(").removesuffix(");")
        assert conn.execute(f"SELECT {pair}").fetchone() == (42, int32)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", {"key": "123", "namespace": None, "resource": None}),
        ("-5", {"key": "-5", "namespace": None, "resource": None}),
        ("42:1001", {"key": "42:1001", "namespace": 42, "resource": 1001}),
    ],
)
def test_key_accepts_numeric_forms(text: str, expected: dict[str, object]) -> None:
    info = key_json(text)
    assert {k: info[k] for k in expected} == expected
    assert info["name"] is None
    assert (
        info["sql"]
        == info["sql_numeric"]
        == f"SELECT pg_try_advisory_lock({text.replace(':', ', ')});"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["key", ""], "must not be empty"),
        (["key", "123", "--namespace", "4"], "names only"),
        (["key", "9223372036854775808"], "int64"),
        (["key", "2147483648:1"], "pair"),
        (["key", "x" * 1025], "1024"),
        (["key", "job", "--namespace", "2147483648"], "namespace"),
    ],
)
def test_bad_key_is_a_usage_error(args: list[str], message: str) -> None:
    done = pgsolo(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_a_pair_with_a_negative_part_is_written_as_the_error_says(dsn: str) -> None:
    """Guards the way to give a key that `pgsolo locks` shows as -5:-6: argparse takes the
    word for an option, and said only "expected one argument"."""
    for args, written in (
        (["key", "-5:-6"], ["key", "--json", "--", "-5:-6"]),
        (["locks", "--key", "-5:-6", "--dsn", dsn], ["locks", "--key=-5:-6", "--dsn", dsn]),
    ):
        refused = pgsolo(*args)
        assert refused.returncode == 2
        advice = "after --: pgsolo key -- -5:-6" if args[0] == "key" else "--key=-5:-6"
        assert f"(-5:-6 starts with '-': write it {advice})" in refused.stderr
        done = pgsolo(*written)
        assert done.returncode == 0, done.stderr
        if args[0] == "key":
            assert json_document(done.stdout)["key"] == "-5:-6"


@pytest.mark.parametrize("text", ["42:abc", "42:1001:3", " spaced "])
def test_a_key_that_is_a_name_only_by_mistake_is_a_usage_error(
    text: str, dsn: str, tmp_path: Path
) -> None:
    """`pgsolo key`, `pgsolo locks --key` and `pgsolo run --key` refuse it (exit 2, nothing
    started) and say what they would accept; --key-is-name takes the text as a name."""
    marker = tmp_path / "ran"
    for args in (
        ["key", text],
        ["locks", "--key", text, "--dsn", dsn],
        ["run", "--key", text, "--dsn", dsn, "--", *touching(marker)],
    ):
        done = pgsolo(*args)
        assert done.returncode == 2, done.stderr
        assert "--key-is-name" in done.stderr
        assert ("42:1001" if ":" in text else "'spaced'") in done.stderr
    assert not marker.exists()
    assert key_json(text, "--key-is-name")["name"] == text
    done = pgsolo("run", "--key", text, "--key-is-name", "--dsn", dsn, "--", *touching(marker))
    assert done.returncode == 0, done.stderr
    assert marker.exists()
