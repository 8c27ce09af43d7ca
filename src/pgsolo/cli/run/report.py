"""How one ``pgsolo run`` ended: the report behind ``--json``, with the exit code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..._types import Outcome
from ...reasons import Reason, RunReason
from ..output import document, error_code

__all__ = ["RunReport"]


@dataclass(slots=True)
class RunReport:
    """How one ``pgsolo run`` ended; :meth:`as_dict` is the ``--json`` object."""

    exit_code: int
    outcome: Outcome | None  # None: the attempt never got as far as the lock
    reason: Reason | RunReason | None  # pgsolo.reasons
    job: str
    key: str
    key_name: str | None
    lock_wait: float = 0.0
    duration: float = 0.0
    backend_pid: int | None = None
    database: str | None = None
    server: str | None = None
    application_name: str | None = None
    command_exit_code: int | None = None
    lingering_processes: int = 0
    """Processes COMMAND started that still ran when it exited: the lock was held until
    they ended (or, with ``--kill-on-exit``, until they were stopped)."""
    error: str | None = None
    """A one-line explanation for a person (never a password)."""
    recorded: bool = False
    notice: str | None = None
    """A line for a person about an ending that is no error (a skip: who holds the key)."""

    @property
    def error_line(self) -> str | None:
        """``error`` on one line: a driver's message can span several (libpq's do)."""
        if self.error is None:
            return None
        return " ".join(part.strip() for part in self.error.splitlines() if part.strip())

    def as_dict(self) -> dict[str, Any]:
        """The ``pgsolo.run/1`` document (README "JSON output"); ``error`` is an object
        like every command's, its ``code`` the reason."""
        error = (
            {"code": error_code(self.exit_code, self.reason), "message": self.error_line}
            if self.error is not None
            else None
        )
        return document(
            "run",
            {
                "outcome": self.outcome,
                "reason": self.reason,
                "job": self.job,
                "key": self.key,
                "key_name": self.key_name,
                "exit_code": self.exit_code,
                "command_exit_code": self.command_exit_code,
                "lingering_processes": self.lingering_processes,
                "lock_wait_seconds": round(self.lock_wait, 6),
                "duration_seconds": round(self.duration, 6),
                "backend_pid": self.backend_pid,
                "database": self.database,
                "server": self.server,
                "application_name": self.application_name,
                "recorded": self.recorded,
                "error": error,
            },
        )
