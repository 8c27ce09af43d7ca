"""pgsolo's log lines: one logger, one formatter.

Every event is one line, ``"<subject> <what>: key=value ..."``, and the same fields as a
dict in ``record.pgsolo`` for structured logging. Lock attempts, job outcomes and
operation keys all go through :func:`log_event`, so an incident's lines read alike and a
log pipeline parses one shape. Passwords never get here: nothing pgsolo logs carries a
connection string.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

__all__ = ["LOG_FORMAT", "log_event", "logger"]

logger = logging.getLogger("pgsolo")

# The command line's lines, and its worker processes'.
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"


def log_event(
    level: int, subject: str, field: str, what: str, fields: Mapping[str, object]
) -> None:
    """One line about ``subject`` (``advisory lock``, ``job``, ``operation``): ``what``
    happened (``acquired``, ``completed``...), then ``fields`` (those that are not None).
    ``record.pgsolo`` holds ``{field: what, **fields}``."""
    if not logger.isEnabledFor(level):
        return
    shown = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    logger.log(level, "%s %s: %s", subject, what, shown, extra={"pgsolo": {field: what, **fields}})
