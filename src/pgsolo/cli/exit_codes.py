"""The exit codes of the ``pgsolo`` command (DESIGN §5, normative)."""

from __future__ import annotations

from ..errors import DatabaseUnavailableError, PgsoloError, UnsafeConnectionError, UsageError

__all__ = [
    "EXIT_FAILED",
    "EXIT_LOST",
    "EXIT_OK",
    "EXIT_SKIPPED",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "EXIT_USAGE",
    "exit_code_of",
]

# Exit codes (DESIGN §5, normative).
EXIT_OK = 0


EXIT_FAILED = 1


EXIT_USAGE = 2


EXIT_UNAVAILABLE = 69  # database unavailable


EXIT_LOST = 70  # lock lost while the command ran


EXIT_SKIPPED = 75  # busy, wait timed out, or already done


EXIT_UNSAFE = 78  # unsafe configuration (session lock behind a transaction pooler)


def exit_code_of(exc: PgsoloError) -> int:
    """The exit code of a pgsolo error that ended a command before its work could run."""
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    if isinstance(exc, UnsafeConnectionError):  # a standby, a transaction pooler
        return EXIT_UNSAFE
    if isinstance(exc, DatabaseUnavailableError):
        return EXIT_UNAVAILABLE
    return EXIT_FAILED
