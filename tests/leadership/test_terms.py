"""When a term began, recorded on the server (``pgsolo.leader_terms``) by a leader on a
connection pgsolo opened, and shown by ``pgsolo doctor`` and ``pgsolo locks``: a
candidate that waited before it won leads from its win, not from its session's start; a
caller's connection is left as it was (nothing written, the monitor shows a bound); a
database whose schema predates the table still has leaders."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import DEADLINE, Connect, eventually, run_cli, unique_name
from pgsolo.keys import leader_key

Observer = Any


def term_row(observer: Observer, name: str) -> tuple[Any, ...] | None:
    """The recorded term of ``name``: (token, pid, backend_start, started_at)."""
    return observer.conn.execute(  # type: ignore[no-any-return]
        "SELECT token, pid, backend_start, started_at FROM pgsolo.leader_terms WHERE name = %s",
        (name,),
    ).fetchone()


def backend_start(observer: Observer, pid: int) -> datetime:
    row = observer.conn.execute(
        "SELECT backend_start FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def leaders_check(conn: psycopg.Connection[Any]) -> pgsolo.Check:
    return {check.name: check for check in pgsolo.doctor(conn)}["leaders"]


@contextmanager
def leading_in_thread(dsn: str, name: str) -> Iterator[tuple[list[pgsolo.Term], threading.Event]]:
    """A candidate in a thread of its own: it leads ``name`` (its term appears in the
    list) until the event is set."""
    terms: list[pgsolo.Term] = []
    done = threading.Event()

    def candidate() -> None:
        with pgsolo.leader(dsn, name, wait=DEADLINE) as term:
            terms.append(term)
            done.wait(DEADLINE)

    thread = threading.Thread(target=candidate)
    thread.start()
    try:
        yield terms, done
    finally:
        done.set()
        thread.join(DEADLINE)


def test_a_candidate_that_waited_leads_from_its_win_not_its_sessions_start(
    db: str, observer: Observer, connect: Connect
) -> None:
    name = unique_name("leader")
    key = leader_key(name)
    with leading_in_thread(db, name) as (first, first_done):
        eventually(lambda: first, "the first leader")
        assert term_row(observer, name)[:2] == (first[0].token, first[0].backend_pid)  # type: ignore[index]
        with leading_in_thread(db, name) as (second, second_done):
            waiting = eventually(lambda: observer.waiters(key), "the candidate's wait")
            (candidate_pid,) = waiting
            check = eventually(
                lambda: (c := leaders_check(connect())).detail.count("waiting (pid") and c,
                "doctor to see the candidate",
            )
            assert check.status == "ok"
            assert f"{name!r}: pid {first[0].backend_pid} ('pgsolo:leader:{name}'" in check.detail
            assert f"1 candidate(s) waiting (pid {candidate_pid})" in check.detail
            assert "leading for " in check.detail
            assert "at most" not in check.detail  # its term's start is recorded
            first_done.set()
            eventually(lambda: second, "the candidate to lead")
            term = second[0]
            assert term.backend_pid == candidate_pid
            token, pid, session_start, started_at = term_row(observer, name)  # type: ignore[misc]
            assert (token, pid) == (term.token, candidate_pid)
            assert session_start == backend_start(observer, candidate_pid)
            assert started_at > session_start  # it waited on that session before it won
            (lock,) = [lock for lock in pgsolo.advisory_locks(connect(), key=key) if lock.granted]
            assert (lock.since, lock.since_source) == (started_at, "term_start")
            check = leaders_check(connect())
            assert f"{name!r}: pid {candidate_pid} (" in check.detail
            assert f"(since {started_at.isoformat(timespec='seconds')})" in check.detail
            assert "no candidate waiting" in check.detail
            second_done.set()


def test_a_campaign_records_each_term_on_the_connection_it_keeps(
    db: str, observer: Observer
) -> None:
    name = unique_name("leader")
    stop = threading.Event()
    terms: list[pgsolo.Term] = []

    def lead(term: pgsolo.Term) -> None:
        terms.append(term)
        stop.set()

    pgsolo.campaign(db, name, lead, stop=stop)
    (term,) = terms
    token, pid, _, _ = term_row(observer, name)  # type: ignore[misc]
    assert (token, pid) == (term.token, term.backend_pid)


def test_on_a_callers_connection_nothing_is_written_and_doctor_shows_the_bound(
    db: str, observer: Observer, connect: Connect
) -> None:
    name = unique_name("leader")
    conn = connect()
    conn.execute(
        "SELECT set_config('application_name', %s, false)", (f"pgsolo:leader:{name}"[:63],)
    )
    with pgsolo.leader(conn, name) as term:
        assert term.token is not None
        assert term_row(observer, name) is None  # the connection goes back as found
        check = leaders_check(connect())
        assert f"{name!r}: pid {conn.info.backend_pid} (" in check.detail
        assert "leading for at most " in check.detail
        assert "its session's age" in check.detail
        (lock,) = pgsolo.advisory_locks(connect(), key=term.key)
        assert lock.since_source != "term_start"


def test_a_row_of_another_session_with_the_same_pid_is_not_believed(
    db: str, observer: Observer, connect: Connect
) -> None:
    """pid and backend_start name the session: a row left by an earlier session whose pid
    the holder now has is not its term."""
    name = unique_name("leader")
    conn = connect()
    conn.execute(
        "SELECT set_config('application_name', %s, false)", (f"pgsolo:leader:{name}"[:63],)
    )
    pid = conn.info.backend_pid
    observer.conn.execute(
        "INSERT INTO pgsolo.leader_terms (name, token, pid, backend_start, started_at)"
        " VALUES (%s, 1, %s, '2000-01-01', '2000-01-02')",
        (name, pid),
    )
    with pgsolo.leader(conn, name) as term:
        (lock,) = pgsolo.advisory_locks(connect(), key=term.key)
        assert lock.since_source != "term_start"  # the bound its session gives
        assert "leading for at most " in leaders_check(connect()).detail
    observer.conn.execute(
        "UPDATE pgsolo.leader_terms SET backend_start = %s WHERE name = %s",
        (backend_start(observer, pid), name),
    )
    with pgsolo.leader(conn, name) as term:  # now it is that session's: believed
        (lock,) = pgsolo.advisory_locks(connect(), key=term.key)
        assert lock.since_source == "term_start"


@pytest.fixture
def older_schema(fresh_db: str) -> str:
    """A database migrated by the pgsolo before leader terms (version 3)."""
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        pgsolo.migrate(admin)
        admin.execute("DROP TABLE pgsolo.leader_terms")
        admin.execute("DELETE FROM pgsolo.schema_migrations WHERE version = 4")
    return fresh_db


def test_without_the_table_the_leader_leads_and_doctor_shows_the_bound(
    older_schema: str,
) -> None:
    name = unique_name("leader")
    with (
        pgsolo.leader(older_schema, name) as term,
        psycopg.connect(older_schema, autocommit=True) as looking,
    ):
        assert term.token is not None  # fencing: the sequence is there
        assert not term.lost
        check = leaders_check(looking)
        assert check.status == "ok"
        assert f"{name!r}: pid {term.backend_pid} (" in check.detail
        assert "leading for at most " in check.detail
        (lock,) = pgsolo.advisory_locks(looking, key=term.key)
        assert lock.since_source != "term_start"
    with pgsolo.leader(older_schema, name, fencing=False) as term:
        assert not term.lost


def test_pgsolo_run_leader_records_its_term(db: str, observer: Observer) -> None:
    """``pgsolo run --leader``: its COMMAND runs once the term's start is recorded, on the
    connection it waited on (no fencing token: COMMAND has no term object)."""
    name = unique_name("leader")
    ran = run_cli(
        "run", "--leader", name, "--dsn", db, "--json", "--", sys.executable, "-c", "pass"
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stderr.splitlines()[-1])
    token, pid, _, started_at = term_row(observer, name)  # type: ignore[misc]
    assert (token, pid) == (None, report["backend_pid"])
    assert started_at is not None


@pytest.mark.parametrize("name", ["Grüße-ünd-Zölle", "a-leader-" + "x" * 60])
def test_a_leader_whose_name_its_session_cannot_carry_is_named_from_its_term(
    db: str, connect: Connect, name: str
) -> None:
    """Guards a leader named with letters outside ASCII, or longer than an
    application_name keeps (63 bytes): its session's name says nothing (PostgreSQL shows
    '?' for each such letter, and cuts it), so doctor said nobody led and ``pgsolo locks``
    showed a bare number, though its term was recorded."""
    key = leader_key(name)
    with leading_in_thread(db, name) as (terms, _):
        eventually(lambda: terms, "the leader")
        check = leaders_check(connect())
        assert f"{name!r}: pid {terms[0].backend_pid}" in check.detail
        (lock,) = [lock for lock in pgsolo.advisory_locks(connect()) if lock.key == key]
        assert lock.name == f"pgsolo:leader:{name}"
        assert lock.since_source == "term_start"
