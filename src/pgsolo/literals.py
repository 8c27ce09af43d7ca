"""Quoting text into SQL, for the few statements that must travel without parameters."""

from __future__ import annotations

__all__ = ["sql_literal", "sql_text"]


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
