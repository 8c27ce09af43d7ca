"""The ``--json`` vocabulary of every command (README "JSON output", the JSON Schemas in
``pgsolo/cli/schemas/``).

Every document is one object whose ``schema`` field names its shape and version,
``pgsolo.<command>/<version>``; a command that fails after its arguments were parsed
prints a ``pgsolo.error/1`` document instead, with the same exit code as without
``--json``. The same thing has the same name everywhere: durations are float seconds
named ``*_seconds``, a key is ``key`` (its command-line form, a string), ``database`` is
the database's name and ``server`` where pgsolo connected (never a password),
``outcome`` and ``reason`` carry the library's values (:class:`pgsolo.JobResult`,
:mod:`pgsolo.reasons`).
"""

from __future__ import annotations

import json
import sys
from typing import IO, Any

from .exit_codes import (
    EXIT_FAILED,
    EXIT_LOST,
    EXIT_SKIPPED,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_USAGE,
)

__all__ = [
    "SCHEMA_VERSION",
    "document",
    "emit_json",
    "error_code",
    "error_document",
    "print_json",
]


SCHEMA_VERSION = 1  # bumped, per document, when a field changes meaning or goes away


def document(command: str, fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` as the ``--json`` document of ``command``, its ``schema`` first."""
    return {"schema": f"pgsolo.{command}/{SCHEMA_VERSION}", **fields}


def emit_json(command: str, fields: dict[str, Any], *, stream: IO[str] | None = None) -> None:
    """Print the ``--json`` document of ``command`` as one line (stdout by default)."""
    print_json(document(command, fields), stream=stream)


def print_json(doc: dict[str, Any], *, stream: IO[str] | None = None) -> None:
    print(json.dumps(doc), file=stream or sys.stdout, flush=True)


# The error code for an exit code, when the failure does not name a more precise one.
_CODES = {
    EXIT_USAGE: "usage-error",
    EXIT_UNAVAILABLE: "database-unavailable",
    EXIT_UNSAFE: "unsafe-connection",
    EXIT_SKIPPED: "busy",
    EXIT_LOST: "lost",
    EXIT_FAILED: "failed",
}


def error_code(exit_code: int, code: str | None = None) -> str:
    return code or _CODES.get(exit_code, "failed")


def error_document(
    command: str, exit_code: int, message: str, code: str | None = None
) -> dict[str, Any]:
    """What ``pgsolo COMMAND --json`` prints when COMMAND fails: the same exit code and
    message as without ``--json``, and a stable ``code``."""
    return document(
        "error",
        {
            "command": command,
            "exit_code": exit_code,
            "error": {"code": error_code(exit_code, code), "message": message},
        },
    )
