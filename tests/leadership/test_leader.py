"""``pgsolo.leader()``: one leader at a time among real concurrent candidates (threads,
each with its own connection), waiters that hold back nothing, a term lost to a
terminated backend, and a connection given back as it was found."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import (
    HOLD,
    SLICE_BOUND,
    Connect,
    SnapshotWatch,
    app_name_of,
    eventually,
    terminate,
    unique_name,
)
from pgsolo.keys import leader_key

Observer = Any


def test_one_leader_at_a_time_and_each_term_a_larger_token(db: str, observer: Observer) -> None:
    name = unique_name("leader")
    guard = threading.Lock()
    leading: list[int] = []  # who leads now
    terms: list[tuple[int, int | None]] = []  # (candidate, token), in the order they led
    overlaps: list[list[int]] = []
    errors: list[BaseException] = []

    def candidate(me: int) -> None:
        try:
            for _ in range(3):
                with pgsolo.leader(db, name) as term:
                    with guard:
                        leading.append(me)
                        terms.append((me, term.token))
                        if len(leading) > 1:
                            overlaps.append(list(leading))
                    time.sleep(0.02)
                    with guard:
                        leading.remove(me)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=candidate, args=(me,)) for me in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert not overlaps
    assert len(terms) == 12
    tokens = [token for _, token in terms]
    assert all(isinstance(token, int) for token in tokens)
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 12
    assert observer.holders(leader_key(name)) == set()  # nothing left held


def test_a_waiting_candidate_holds_no_old_transaction_or_snapshot(
    db: str, connect: Connect, observer: Observer, short_slices: float
) -> None:
    """A waiter never holds back VACUUM: it waits in bounded slices (here of
    ``short_slices``), each its own statement, so its backend never has a snapshot or a
    transaction older than about one slice, however long it waits."""
    name = unique_name("leader")
    key = leader_key(name)
    led = threading.Event()

    def waiter() -> None:
        with pgsolo.leader(db, name):
            led.set()

    with pgsolo.leader(db, name) as term:
        thread = threading.Thread(target=waiter)
        thread.start()
        pid = eventually(lambda: next(iter(observer.waiters(key)), None), "the waiter's wait")
        with SnapshotWatch(connect(), pid) as watch:
            time.sleep(HOLD)
        assert observer.holders(key) == {term.backend_pid}
        assert not led.is_set()
    thread.join(20)
    assert led.is_set()
    assert watch.saw_lock_wait
    assert watch.oldest_snapshot < SLICE_BOUND, f"a snapshot {watch.oldest_snapshot:.2f}s old"
    assert watch.oldest_transaction < SLICE_BOUND, (
        f"a transaction {watch.oldest_transaction:.2f}s old"
    )


def test_a_candidate_that_waits_too_long_raises_and_holds_nothing(
    db: str, observer: Observer
) -> None:
    name = unique_name("leader")
    with pgsolo.leader(db, name) as term:
        started = time.monotonic()
        with pytest.raises(pgsolo.LockTimeoutError), pgsolo.leader(db, name, wait=0.3):
            pytest.fail("two leaders")
        assert time.monotonic() - started >= 0.3
        assert observer.holders(leader_key(name)) == {term.backend_pid}


def test_a_terminated_leader_learns_it_and_a_candidate_takes_over(
    db: str, observer: Observer
) -> None:
    name = unique_name("leader")
    seen: list[pgsolo.LockLostError] = []
    keep = pgsolo.Keep(interval=0.2, timeout=5, on_lost=seen.append)
    taken_over = threading.Event()

    def candidate() -> None:
        with pgsolo.leader(db, name):
            taken_over.set()

    with (  # noqa: PT012 - the end of the block, after the loss, is what raises
        pytest.raises(pgsolo.LockLostError) as ended,
        pgsolo.leader(db, name, keep=keep) as term,
    ):
        thread = threading.Thread(target=candidate)
        thread.start()
        assert not term.lost
        assert term.loss is None
        term.check()
        assert not term.wait_lost(0.05)
        terminate(observer, term.backend_pid)
        assert term.wait_lost(20)
        assert term.wait_lost()  # at once, once lost
        assert term.lost
        assert term.loss is not None
        assert len(seen) == 1
        assert seen[0] is term.loss
        with pytest.raises(pgsolo.LockLostError):
            term.check()
        assert taken_over.wait(20)  # the next leader did not wait for this block to end
    assert ended.value.reason == "connection-lost"
    thread.join(20)


def test_a_term_without_a_keeper_cannot_wait_for_its_loss(db: str) -> None:
    with pgsolo.leader(db, unique_name("leader"), keep=False) as term:
        assert term.token is not None
        with pytest.raises(pgsolo.UsageError, match="keep=False"):
            term.wait_lost(0.1)


def test_without_fencing_a_term_has_no_token(db: str) -> None:
    with pgsolo.leader(db, unique_name("leader"), fencing=False) as term:
        assert term.token is None


def test_fencing_needs_the_migrated_tables(fresh_db: str) -> None:
    with (
        pytest.raises(pgsolo.NotMigratedError),
        pgsolo.leader(fresh_db, unique_name("leader")),
    ):
        pytest.fail("led without the tables fencing tokens need")


def test_the_connection_pgsolo_opens_is_named_for_the_leader(db: str, observer: Observer) -> None:
    name = unique_name("leader")
    with pgsolo.leader(db, name) as term:
        assert term.backend_pid is not None
        assert app_name_of(observer, term.backend_pid) == f"pgsolo:leader:{name}"[:63]
        assert term.name == name
        assert term.key == leader_key(name)
        assert repr(term).startswith(f"<Term {name!r} token=")
    assert eventually(lambda: app_name_of(observer, term.backend_pid) is None, "its close")


def test_a_connection_of_the_caller_goes_back_as_it_was_found(
    db: str, connect: Connect, observer: Observer
) -> None:
    conn: psycopg.Connection[Any] = connect()
    conn.execute("SET application_name = 'mine'")
    name = unique_name("leader")
    with pgsolo.leader(conn, name) as term:
        assert term.backend_pid == conn.info.backend_pid
        assert observer.holders(leader_key(name)) == {conn.info.backend_pid}
    assert observer.holders(leader_key(name)) == set()
    assert conn.autocommit
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    assert conn.execute("SHOW application_name").fetchone() == ("mine",)
    assert not conn.closed


def test_the_locks_view_names_the_leader_and_its_waiting_candidates(
    db: str, connect: Connect
) -> None:
    """``pgsolo locks`` (advisory_locks) names a leader's key by the application_name
    of the sessions pgsolo opened for it, its holder granted and its candidates waiting."""
    name = unique_name("leader")
    waiting = threading.Event()

    def candidate() -> None:
        waiting.set()
        with pgsolo.leader(db, name, wait=20):
            pass

    with pgsolo.leader(db, name) as term:
        thread = threading.Thread(target=candidate)
        thread.start()
        waiting.wait(5)

        def rows() -> list[pgsolo.AdvisoryLock]:
            found = pgsolo.advisory_locks(connect(), key=term.key)
            return found if len(found) == 2 else []

        locks = eventually(rows, "the leader and its candidate in the view")
        assert {lock.key.name for lock in locks} == {f"pgsolo:leader:{name}"}
        leading = [lock for lock in locks if lock.granted]
        assert [lock.pid for lock in leading] == [term.backend_pid]
        assert [lock.lifetime for lock in leading] == ["session"]
    thread.join(20)
