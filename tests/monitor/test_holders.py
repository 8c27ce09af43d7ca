"""``is_locked`` and ``lock_holders``: every form of key the lock calls take, shared
holders, and bad input refused before any SQL. Each kind of connection (sync and async)
is covered by the conformance suite (tests/drivers/_async/test_conformance.py)."""

from __future__ import annotations

import pytest

import pgsolo
from _support import Connect
from pgsolo import InvalidKeyError, Key, Registry


@pytest.mark.parametrize(
    ("given", "as_locked"),
    [
        (4_242_001, 4_242_001),
        ((42, 1001), (42, 1001)),
        ("nightly-holders", "nightly-holders"),
    ],
    ids=["int", "pair", "name"],
)
def test_a_key_is_asked_for_as_the_lock_calls_take_it(
    connect: Connect, given: object, as_locked: object
) -> None:
    holder, asker = connect(), connect()
    assert not pgsolo.is_locked(asker, given)  # type: ignore[arg-type]
    with pgsolo.session_lock(holder, as_locked) as held:  # type: ignore[arg-type]
        assert held.acquired
        assert pgsolo.is_locked(asker, given)  # type: ignore[arg-type]
        (row,) = pgsolo.lock_holders(asker, given)  # type: ignore[arg-type]
        assert row.pid == holder.info.backend_pid
    assert not pgsolo.is_locked(asker, given)  # type: ignore[arg-type]


def test_a_namespace_and_a_registry_resolve_the_name(connect: Connect) -> None:
    holder, asker = connect(), connect()
    registry = Registry({"billing": (77, 1)})
    with pgsolo.session_lock(holder, "report", namespace=77):
        assert pgsolo.is_locked(asker, "report", namespace=77)
        assert not pgsolo.is_locked(asker, "report")  # another key: the int64 derivation
        assert pgsolo.lock_holders(asker, "report", namespace=77)[0].name == "report"
    with pgsolo.session_lock(holder, (77, 1)):
        (row,) = pgsolo.lock_holders(asker, "billing", registry=registry)
        assert row.name == "billing"
        assert row.key == Key((77, 1), "billing")


def test_every_holder_of_a_shared_lock_is_listed_and_its_own_session_counts(
    connect: Connect, key: Key
) -> None:
    first, second = connect(), connect()
    with (
        pgsolo.session_lock(first, key, shared=True),
        pgsolo.session_lock(second, key, shared=True),
    ):
        holders = pgsolo.lock_holders(first, key)
        assert sorted(h.pid for h in holders) == sorted(c.info.backend_pid for c in (first, second))
        assert all(h.shared and h.granted for h in holders)
        assert pgsolo.is_locked(first, key)


@pytest.mark.parametrize("bad", [(1, 2, 3), "", 2**63, [1, 2], True], ids=repr)
def test_a_bad_key_is_refused_before_any_sql(connect: Connect, bad: object) -> None:
    conn = connect()
    conn.close()  # any SQL would fail with a driver error, not the key's
    with pytest.raises(InvalidKeyError):
        pgsolo.is_locked(conn, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        pgsolo.lock_holders(conn, 42, namespace=1)  # namespace= is for names only


async def test_the_async_calls_refuse_a_sync_connection(connect: Connect, key: Key) -> None:
    with pytest.raises(pgsolo.UnsupportedConnectionError, match="sync"):
        await pgsolo.is_locked_async(connect(), key)  # type: ignore[arg-type]
