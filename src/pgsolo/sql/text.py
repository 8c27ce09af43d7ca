"""Text in and out of pgsolo's statements, whatever the session's settings and encoding.

In: text spliced into a statement is written as ASCII hex digits (:func:`sql_text`) or as
an escaped literal (:func:`sql_literal`), so no setting or client encoding can turn a
byte of it into a quote. Out: every text or JSON answer comes back as the ``bytea`` of its
UTF-8 bytes (:func:`utf8`), decoded here (:func:`read_text`, :func:`read_json`): under
``SQL_ASCII`` psycopg would return text as ``bytes``, under ``LATIN1`` the server would
refuse a character that encoding lacks.
"""

from __future__ import annotations

import functools
import json
from typing import Any

__all__ = [
    "TRUTH_BY_COUNT",
    "Truth",
    "read_json",
    "read_text",
    "returns_rows",
    "sql_literal",
    "sql_text",
    "text_or_null",
    "truth_by_count",
    "utf8",
]


class Truth(str):
    """A statement of pgsolo's that returns one row of one value, true, false or NULL (a
    lock taken or not, a key released or not). Marked, so that a driver that reads no rows
    of a simple query can read its answer from the row count of a rewrite of it instead
    (asyncpg: :func:`truth_by_count`)."""

    __slots__ = ()


# The rows of truth_by_count(): as many as the position of the value in this tuple.
TRUTH_BY_COUNT = (False, True, None)


@functools.lru_cache(maxsize=1024)  # as the statements it rewrites are
def truth_by_count(statement: Truth) -> str:
    """``statement`` as a SELECT of no columns and 0, 1 or 2 rows for false, true and
    NULL (:data:`TRUTH_BY_COUNT`). The statement runs once: as an uncorrelated scalar
    subquery (an InitPlan, evaluated once per execution) tested once by a simple CASE,
    the argument of a set-returning function in FROM. The server plans this about as
    cheaply as the statement alone; a CTE joined to a VALUES list cost it a third more
    per lock over a local socket."""
    return (
        "SELECT FROM generate_series(1, CASE"
        f" ({statement}) WHEN true THEN 1 WHEN false THEN 0 ELSE 2 END) AS pgsolo_count(n)"
    )


def returns_rows(statement: str) -> bool:
    """Whether one of pgsolo's statements returns rows: its SELECTs, the monitor's
    read-only ``WITH ... SELECT``, and ``INSERT``/``UPDATE``/``DELETE ... RETURNING``.
    Drivers that read only one result of a message (psycopg2's last, asyncpg's COPY) use it
    to find the statement whose value pgsolo asked for."""
    if statement.startswith(("SELECT", "WITH")):
        return True
    return statement.startswith(("INSERT", "UPDATE", "DELETE")) and " RETURNING " in statement


def sql_literal(text: str) -> str:
    """``text`` as a SQL string literal that reads the same whatever the session settings.

    A plain ``'...'`` literal treats a backslash as an escape when
    ``standard_conforming_strings`` is off, which would change the value or let it break
    out of the literal; an ``E'...'`` literal escapes backslashes in every setting.
    """
    if "\0" in text:
        raise ValueError("a SQL string literal cannot contain a NUL character")
    quoted = text.replace("'", "''")
    if "\\" not in text:
        return f"'{quoted}'"
    return "E'" + quoted.replace("\\", "\\\\") + "'"


def sql_text(text: str) -> str:
    """``text`` as a SQL expression written in ASCII hex digits only.

    For the statements pgsolo sends itself (job names, hosts, error messages): whatever
    the connection's ``client_encoding`` or ``standard_conforming_strings``, the server
    reads exactly these characters, and no byte of the value can be taken for a quote or
    a backslash. Characters that cannot be encoded (lone surrogates) become escapes.
    """
    if "\0" in text:
        raise ValueError("SQL text cannot contain a NUL character")
    data = text.encode("utf-8", errors="backslashreplace").hex()
    return f"convert_from(decode('{data}', 'hex'), 'UTF8')"


def utf8(expression: str) -> str:
    """``expression`` (text, or anything with a text form such as json) as the ``bytea``
    of its UTF-8 bytes: the server sends those bytes as they are (hex digits, or escapes,
    in ASCII) whatever the connection's ``client_encoding``. Read it with
    :func:`read_text` or :func:`read_json`. In a SQL_ASCII database, whose text may hold
    any bytes (another session's query...), the bytes as stored: a conversion to UTF-8
    would refuse a byte that is not UTF-8, and :func:`read_text` replaces it instead."""
    return f"convert_to(({expression})::text, {_STORED_AS})"


# The encoding utf8() asks for: UTF-8, but for a SQL_ASCII database, whose bytes go as they are.
_STORED_AS = (
    "CASE current_setting('server_encoding') WHEN 'SQL_ASCII' THEN 'SQL_ASCII' ELSE 'UTF8' END"
)


def read_text(value: object) -> str | None:
    """What a :func:`utf8` column came back as (bytes), as text; None stays None."""
    if value is None:
        return None
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected the bytes of a utf8() column, got {type(value).__name__}")
    # A database whose own encoding is SQL_ASCII may hold any bytes: show, never fail.
    return bytes(value).decode("utf-8", errors="replace")


def read_json(value: object) -> Any:
    """What a :func:`utf8` column of JSON came back as, parsed; None stays None."""
    text = read_text(value)
    return None if text is None else json.loads(text)


def text_or_null(value: str | None) -> str:
    return "NULL" if value is None else sql_text(value.replace("\0", ""))
