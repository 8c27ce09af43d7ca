"""Every job name and operation key a user can give, fuzzed on connections of every
encoding pgsolo may meet: databases in UTF8, LATIN1, WIN1252, EUC_JP and SQL_ASCII, and
the client-only encodings SJIS and BIG5 on a UTF8 database. A name is stored and read back
equal (``history``, ``run_once``'s results), or refused with a typed pgsolo error; never a
raw driver error, and never a lock left held or a transaction left open."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import HOSTILE_TEXT, assert_clean, fuzz, nothing_sent
from pgsolo import Key

SERVER_ENCODINGS = ["LATIN1", "WIN1252", "EUC_JP", "SQL_ASCII"]
# (database encoding, client_encoding): a server cannot be SJIS or BIG5
PLACES = [("UTF8", "UTF8"), ("UTF8", "SJIS"), ("UTF8", "BIG5")]
PLACES += [(encoding, encoding) for encoding in SERVER_ENCODINGS]
NAMES = st.one_of(HOSTILE_TEXT, st.integers(), st.binary(max_size=4))  # None: the key's text


@pytest.fixture(scope="module")
def places(db: str) -> Iterator[dict[tuple[str, str], str]]:
    """A migrated database in each server encoding (the test database is the UTF8 one):
    the connection string of each place."""
    created: list[str] = []
    found = {}
    with psycopg.connect(db, autocommit=True) as admin:
        try:
            for encoding in SERVER_ENCODINGS:
                name = f"pgsolo_fuzz_{encoding.lower()}_{uuid.uuid4().hex[:8]}"
                admin.execute(
                    pgsql.SQL(
                        "CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C'"
                        " TEMPLATE template0"
                    ).format(pgsql.Identifier(name), pgsql.Literal(encoding))
                )
                created.append(name)
                found[encoding, encoding] = make_conninfo(db, dbname=name)
                with psycopg.connect(found[encoding, encoding], autocommit=True) as conn:
                    pgsolo.migrate(conn)
            for place in PLACES[:3]:
                found[place] = make_conninfo(db, client_encoding=place[1])
            yield found
        finally:
            for name in created:
                admin.execute(
                    pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        pgsql.Identifier(name)
                    )
                )


def storable(text: object) -> bool:
    """Non-empty text without NUL that UTF-8 can carry (no lone surrogate)."""
    if not isinstance(text, str) or not text or "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@fuzz(60)
@given(NAMES, st.sampled_from(PLACES))
@example(name="\u6771\u4eac", place=("LATIN1", "LATIN1"))  # was a raw UntranslatableCharacter
def test_any_job_name_is_recorded_and_read_back_equal_or_refused_before_any_sql(
    places: dict[tuple[str, str], str],
    observer: Any,
    key: Key,
    name: Any,
    place: tuple[str, str],
) -> None:
    with psycopg.connect(places[place], autocommit=True) as conn:
        if not storable(name):
            with nothing_sent(conn, observer), pytest.raises(pgsolo.UsageError):
                pgsolo.run_job(conn, key, lambda c: "never", name=name, record=True)
        else:
            ran: list[object] = []

            def work(c: object) -> str:
                ran.append(c)
                return "ran"

            try:
                result = pgsolo.run_job(conn, key, work, name=name, record=True)
            except pgsolo.InvalidArgumentError:  # the database's encoding lacks a character
                assert place[0] not in ("UTF8", "SQL_ASCII")
                # Refused before the work: a job whose work ran must never end in an error
                # that invites the caller to run it again.
                assert ran == []
            else:
                assert (result.outcome, result.value) == ("completed", "ran")
                [row] = pgsolo.history(conn, job=name, limit=1)
                assert (row["job"], row["outcome"]) == (name, "completed")
        assert_clean(conn, observer)


@fuzz(60)
@given(NAMES, st.sampled_from(PLACES))
@example(op_key="\u6771\u4eac", place=("LATIN1", "LATIN1"))  # was a raw UntranslatableCharacter
def test_any_operation_key_runs_once_and_reads_back_equal_or_is_refused_before_any_sql(
    places: dict[tuple[str, str], str], observer: Any, op_key: Any, place: tuple[str, str]
) -> None:
    """The key is made unique per example (a suffix), so that each runs once anew; the
    result echoes it, so the stored JSON carries the same text back."""
    if isinstance(op_key, str):
        op_key += f"~{uuid.uuid4().hex[:8]}"
    seen: list[tuple[str, str]] = []

    def operation(ctx: pgsolo.OperationContext[Any]) -> object:
        seen.append((ctx.op_key, ctx.idempotency_key))
        return {"op_key": ctx.op_key}

    with psycopg.connect(places[place], autocommit=True) as conn:
        valid = storable(op_key) and len(op_key.encode("utf-8")) <= 512
        if not valid:
            with nothing_sent(conn, observer), pytest.raises(pgsolo.UsageError):
                pgsolo.run_once(conn, op_key, operation)
        else:
            try:
                first = pgsolo.run_once(conn, op_key, operation)
            except pgsolo.InvalidOperationKeyError:  # the database's encoding lacks a character
                assert place[0] not in ("UTF8", "SQL_ASCII")
                assert seen == []
                assert_clean(conn, observer)
                return
            again = pgsolo.run_once(conn, op_key, operation)
            assert (first.outcome, again.outcome) == ("ran", "already-succeeded")
            assert first.result == again.result == {"op_key": op_key}
            assert seen == [(op_key, pgsolo.idempotency_key_for(op_key))]
        assert_clean(conn, observer)
