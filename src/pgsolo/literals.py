"""Quoting text into SQL, for the few statements that must travel without parameters."""

from __future__ import annotations

__all__ = ["sql_literal"]


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
