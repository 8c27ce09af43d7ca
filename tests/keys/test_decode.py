"""``decode_pg_lock``: a ``pg_locks`` row back to the key that made it, for real locks
(int64, pair, a name derived in SQL) and for edge cases; what is not an advisory lock's
row is refused.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from _support import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, VECTORS
from pgsolo.errors import InvalidKeyError
from pgsolo.keys import (
    Key,
    decode_pg_lock,
    encode_pg_lock,
    from_name,
)
from pgsolo.sql import name_to_sql

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
