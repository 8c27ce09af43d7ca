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

import argparse
import contextlib
import fcntl
import json
import os
import sys
from typing import IO, Any

from ..errors import UsageError
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
    "JsonDestination",
    "add_json_destination_arguments",
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
    print(json.dumps(_strict(doc)), file=stream or sys.stdout, flush=True)


def _strict(value: Any) -> Any:
    """``value`` with every string made valid Unicode, so the document is valid JSON for
    strict parsers: an argument that was not valid in the locale's encoding (a key given
    as raw bytes) arrives as lone surrogates, which ``json.dumps`` would write as
    ``\\udcff`` escapes, invalid UTF-16. Each undecodable byte is written ``\\xff``
    instead, as pgsolo's text output shows it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            errors = "surrogateescape" if _only_escapes(value) else "surrogatepass"
            return value.encode("utf-8", errors).decode("utf-8", "backslashreplace")
        return value
    if isinstance(value, dict):
        return {_strict(k): _strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict(v) for v in value]
    return value


def _only_escapes(text: str) -> bool:
    """Whether every surrogate in ``text`` stands for an undecodable byte (U+DC80-DCFF)."""
    return all("\udc80" <= c <= "\udcff" for c in text if "\ud800" <= c <= "\udfff")


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


def add_json_destination_arguments(parser: argparse.ArgumentParser) -> None:
    """``pgsolo run``'s ``--json``, ``--json-file PATH`` and ``--json-fd N`` (stdout is
    COMMAND's): where :class:`JsonDestination` writes."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with the outcome on stderr (its last line, after"
        " COMMAND's own stderr), however the run ends once its arguments parse",
    )
    group.add_argument(
        "--json-file",
        metavar="PATH",
        help="write that JSON object to PATH instead (created or emptied when pgsolo starts,"
        " written when it ends), apart from COMMAND's output",
    )
    group.add_argument(
        "--json-fd",
        type=_descriptor,
        metavar="N",
        help="write that JSON object to file descriptor N (3 or more) instead, open for"
        " writing, as in `--json-fd 3 3>report.json`; COMMAND does not inherit it",
    )


_COMMANDS_OWN = ("stdin", "stdout", "stderr")


def _descriptor(text: str) -> int:
    try:
        fd = int(text, 10)
    except ValueError:
        fd = -1
    if fd < 0:
        raise argparse.ArgumentTypeError(f"not a file descriptor: {text!r}")
    if fd < len(_COMMANDS_OWN):
        # The document would land amid COMMAND's own output, where no reader can tell
        # them apart: stdout is COMMAND's, and --json already puts it on stderr.
        raise argparse.ArgumentTypeError(
            f"{fd} is {_COMMANDS_OWN[fd]}, which is COMMAND's: take a descriptor of 3 or"
            " more (`--json-fd 3 3>&1 >&2` for the document alone on stdout), or --json"
            " for stderr"
        )
    return fd


class JsonDestination:
    """Where ``pgsolo run`` writes its one JSON document: a stream of its own when asked
    (``--json-file PATH``, ``--json-fd N``: never COMMAND's output, which COMMAND does
    not inherit), or stderr as its last line (``--json`` alone, as before 0.x's split).

    Opened before anything connects, so that a destination pgsolo cannot write to is a
    usage error (exit 2) before the lock, not a report lost at the end.
    """

    def __init__(self, stream: IO[str], *, owned: bool) -> None:
        self.stream = stream
        self.owned = owned

    @classmethod
    def of(cls, args: argparse.Namespace) -> JsonDestination | None:
        """The destination ``args`` ask for (None: no ``--json`` of any kind)."""
        if args.json_file is not None:
            try:
                return cls(open(args.json_file, "w", encoding="utf-8"), owned=True)
            except OSError as exc:
                raise UsageError(f"--json-file {args.json_file}: {exc.strerror}") from None
        if args.json_fd is not None:
            try:
                mode = fcntl.fcntl(args.json_fd, fcntl.F_GETFL) & os.O_ACCMODE
            except OSError:
                mode = None
            if mode not in (os.O_WRONLY, os.O_RDWR):
                raise UsageError(f"--json-fd {args.json_fd}: not a descriptor open for writing")
            stream = open(args.json_fd, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            return cls(stream, owned=False)
        return cls(sys.stderr, owned=False) if args.json else None

    def write(self, doc: dict[str, Any]) -> None:
        """The document, as one line; then the destination is done with. A destination
        that fails now (a full disk, a reader that went away) is said on stderr, and the
        exit code still tells how the run ended: a failure of its own (1) would hide it."""
        try:
            print_json(doc, stream=self.stream)
        except OSError as exc:
            print(
                f"pgsolo run: error: the JSON document was not written: {exc.strerror or exc}",
                file=sys.stderr,
                flush=True,
            )
            self._discard()
            return
        if self.owned:
            self._discard()

    def _discard(self) -> None:
        """Close the stream pgsolo opened, whatever it still holds: what a write left in
        its buffer would otherwise be flushed, and fail again, as the process exits."""
        if self.stream is sys.stderr:
            return
        with contextlib.suppress(OSError):
            self.stream.close()
