"""A reason is a short code from one vocabulary (:mod:`pgsolo.reasons`), never a message:
every :class:`LockLostError` pgsolo raises carries one, and so does every lost or skipped
:class:`JobResult`. The words are in the error."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, get_args

import psycopg
import pytest

import pgsolo
from _support import Connect, new_job, terminate
from pgsolo import JobResult, Key, LockLostError, LockNotHeldError
from pgsolo.reasons import (
    FAIL_REASONS,
    LOST_REASONS,
    REASONS,
    RUN_REASONS,
    SKIP_REASONS,
    LostReason,
    UnsafeReason,
)


def test_the_vocabulary_is_one_set_of_short_codes() -> None:
    assert set(get_args(LostReason)) == LOST_REASONS
    assert {"connection-lost", "lock-released", "busy", "already-done-this-period"} <= REASONS
    for code in REASONS:
        assert code == code.lower()
        assert " " not in code


def test_the_reasons_table_of_the_docs_is_the_vocabulary() -> None:
    """Guards docs/jobs.md's table of reasons against the vocabulary it describes: it
    lacked ``server-in-recovery`` and ``proxy-unchecked``. Every code of
    :mod:`pgsolo.reasons` has one row, whose outcomes are the families it belongs to."""
    text = (Path(__file__).parent.parent / "docs" / "jobs.md").read_text(encoding="utf-8")
    section = text.split("\n## Reasons\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z-]+)` \| ([a-z ,]+) \|", section, flags=re.MULTILINE)
    documented = {code: set(outcomes.split(", ")) for code, outcomes in rows}
    assert len(rows) == len(documented), "a code has two rows"
    families = {
        "skipped": SKIP_REASONS,
        "lost": LOST_REASONS,
        "refused": frozenset(get_args(UnsafeReason)),
        "failed": FAIL_REASONS,
        "no attempt": RUN_REASONS,
    }
    expected = {
        code: {outcome for outcome, codes in families.items() if code in codes}
        for code in REASONS | RUN_REASONS
    }
    assert documented == expected


# -- LockLostError at the exit of a session_lock block -------------------------------------


@pytest.mark.parametrize("noticed", [False, True], ids=["unnoticed", "noticed"])
def test_a_terminated_session_lock_is_lost_at_exit_with_a_reason(
    connect: Connect, observer: Any, key: Key, noticed: bool
) -> None:
    """Guards: after ``pg_terminate_backend`` the ``LockLostError`` raised at the exit of a
    ``session_lock`` block (no keeper) had ``reason=None``, whether or not the driver had
    noticed the closed connection before the release."""
    conn = connect()

    def hold_while_terminated() -> None:
        with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            terminate(observer, conn.info.backend_pid)
            if noticed:
                with pytest.raises(psycopg.OperationalError):
                    conn.execute("SELECT 1")

    with pytest.raises(LockLostError) as raised:
        hold_while_terminated()
    assert raised.value.reason == "connection-lost"
    assert observer.holders(key) == set()


async def test_a_terminated_async_session_lock_is_lost_at_exit_with_a_reason(
    aconnect: Any, observer: Any, key: Key
) -> None:
    conn = await aconnect()

    async def hold_while_terminated() -> None:
        async with pgsolo.session_lock(conn, key) as lock:
            assert lock.acquired
            terminate(observer, conn.info.backend_pid)

    with pytest.raises(LockLostError) as raised:
        await hold_while_terminated()
    assert raised.value.reason == "connection-lost"


# -- JobResult.reason ----------------------------------------------------------------------


def _check(result: JobResult[Any], reason: str) -> None:
    assert result.reason == reason, result
    assert result.reason in REASONS
    assert result.error is not None  # the words are in the error


def test_a_session_job_whose_lock_is_gone_at_release_has_a_reason_code(
    db: str, observer: Any
) -> None:
    """Guards: the loss found at release put the whole error text into
    ``JobResult.reason``; it is ``lock-released``, the text stays in ``error``."""
    job = new_job("reasons")

    def unlock_all(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SELECT pg_advisory_unlock_all()")

    result = pgsolo.run_job(
        db, job, unlock_all, lifetime="session", record=True, raise_errors=False
    )
    _check(result, "lock-released")
    assert isinstance(result.error, LockNotHeldError)
    [row] = pgsolo.history(observer.conn, job=job)
    assert (row["outcome"], row["reason"]) == ("lost", "lock-released")
    assert "no longer held" in row["error"]

    with pytest.raises(LockLostError) as raised:
        pgsolo.run_job(db, job, unlock_all, lifetime="session")
    assert raised.value.reason == "lock-released"


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_a_job_whose_connection_dies_under_the_work_has_a_reason_code(
    db: str, observer: Any, lifetime: Any
) -> None:
    """Guards: "connection closed while the work ran" was a text; it is
    ``connection-lost``, on the result and on the LockLostError raised for it."""
    job = new_job("reasons")

    def kill(conn: psycopg.Connection[Any]) -> str:
        terminate(observer, conn.info.backend_pid)
        return "returned"

    result = pgsolo.run_job(db, job, kill, lifetime=lifetime, raise_errors=False)
    assert result.outcome == "lost"
    _check(result, "connection-lost")

    with pytest.raises(LockLostError) as raised:
        pgsolo.run_job(db, job, kill, lifetime=lifetime)
    assert raised.value.reason == "connection-lost"


def test_work_that_ends_its_transaction_has_a_reason_code(db: str, observer: Any) -> None:
    """Guards: "the work ended the locked transaction itself (commit or rollback)" was a
    text; it is ``work-ended-transaction`` (result, error, ledger)."""
    job = new_job("reasons")

    def commits(conn: psycopg.Connection[Any]) -> None:
        conn.execute("COMMIT")

    result = pgsolo.run_job(db, job, commits, record=True, raise_errors=False)
    _check(result, "work-ended-transaction")
    assert isinstance(result.error, LockLostError)
    assert result.error.reason == "work-ended-transaction"
    [row] = pgsolo.history(observer.conn, job=job)
    assert row["reason"] == "work-ended-transaction"


def test_work_that_commits_and_begins_again_ended_the_transaction(db: str, observer: Any) -> None:
    """Guards: the LockLostError of the commit check had no reason, and then one of its
    own (``not-held-at-commit``) for what is the same cause as work that commits and
    begins nothing: it is ``work-ended-transaction``, as on every kind of connection
    (tests/drivers/_async/test_framework_words.py)."""
    job = new_job("reasons")

    def carries_on(conn: psycopg.Connection[Any]) -> None:
        conn.execute("COMMIT")
        conn.execute("BEGIN")

    result = pgsolo.run_job(db, job, carries_on, raise_errors=False)
    _check(result, "work-ended-transaction")
    assert isinstance(result.error, LockLostError)
    assert result.error.reason == "work-ended-transaction"
