"""pgsolo's log lines: one logger per layer, one line shape, text or JSON.

Every event is one line, ``"<subject> <what>: key=value ..."``, and the same fields as a
dict in ``record.pgsolo`` for structured logging. Lock attempts, job outcomes and
operation keys all go through :func:`log_event`, so an incident's lines read alike and a
log pipeline parses one shape. Passwords never get here: pgsolo logs no connection string,
and a work's error that quotes one (as written, percent-encoded or quoted) comes with the
connection's password blanked (a driver's ``scrub``).

The loggers are children of ``pgsolo``, so configuring ``pgsolo`` configures them all, and
one layer can be tuned alone (``pgsolo.locks`` to DEBUG to see every acquisition). The
policy, which event at which level on which logger, is in DESIGN.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime

__all__ = [
    "LOG_FORMAT",
    "LOG_FORMATS",
    "JsonFormatter",
    "cli_logger",
    "configure",
    "dashboard_logger",
    "drivers_logger",
    "formatter",
    "jobs_logger",
    "keeper_logger",
    "leaders_logger",
    "locks_logger",
    "log_event",
    "logger",
    "once_logger",
]

logger = logging.getLogger("pgsolo")
locks_logger = logging.getLogger("pgsolo.locks")  # acquisitions, releases, losses
keeper_logger = logging.getLogger("pgsolo.keeper")  # the keeper's own trouble
jobs_logger = logging.getLogger("pgsolo.jobs")  # run_job's outcomes and the ledger
once_logger = logging.getLogger("pgsolo.once")  # operation keys
cli_logger = logging.getLogger("pgsolo.cli")  # the command line (pgsolo run's COMMAND)
drivers_logger = logging.getLogger("pgsolo.drivers")  # connection plumbing
leaders_logger = logging.getLogger("pgsolo.leaders")  # a campaign's terms
dashboard_logger = logging.getLogger("pgsolo.dashboard")  # terminations asked for in a browser

# The command line's lines, and its worker processes'.
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, then the fields of ``record.pgsolo`` (those that are not None), and
    ``exc_info`` with a traceback. A field never replaces one of the first four."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "pgsolo", None)
        if isinstance(fields, Mapping):
            for name, value in fields.items():
                if value is not None:
                    entry.setdefault(str(name), value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        # default=str: a field that is not JSON (a key object, say) is shown as in the text.
        return json.dumps(entry, default=str, ensure_ascii=False)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``--log-format`` ``log_format`` (one of :data:`LOG_FORMATS`)."""
    return JsonFormatter() if log_format == "json" else logging.Formatter(LOG_FORMAT)


def configure(level: int | None, log_format: str) -> None:
    """Log warnings and errors to stderr in ``log_format``, and pgsolo's own lines from
    ``level`` (None: warnings only): the command line, and each of its worker processes."""
    handler = logging.StreamHandler()
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    if level is not None:
        logger.setLevel(level)


def log_event(
    log: logging.Logger,
    level: int,
    subject: str,
    field: str,
    what: str,
    fields: Mapping[str, object],
) -> None:
    """One line on ``log`` about ``subject`` (``advisory lock``, ``job``, ``operation``):
    ``what`` happened (``acquired``, ``completed``...), then ``fields`` (those that are not
    None). ``record.pgsolo`` holds ``{field: what, **fields}``."""
    if not log.isEnabledFor(level):
        return
    shown = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
    log.log(level, "%s %s: %s", subject, what, shown, extra={"pgsolo": {field: what, **fields}})
