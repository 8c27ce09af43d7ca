"""``pgsolo history``: the ledger, newest first."""

from __future__ import annotations

import argparse
import sys
from contextlib import suppress
from datetime import datetime
from typing import Any

from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    connection,
    database,
    int_between,
    print_table,
    where,
)
from .exit_codes import (
    EXIT_OK,
    EXIT_USAGE,
)
from .output import emit_json


def add_history_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "history",
        description="Show the ledger: the latest attempts recorded by `pgsolo run --record`"
        " (or record=True), newest first, and warn about jobs whose recent attempts were"
        " mostly skipped because the previous run was still going.",
    )
    parser.add_argument("--job", metavar="NAME", help="only this job")
    parser.add_argument(
        "--limit", type=int_between(1, 10_000), default=20, metavar="N", help="default: 20"
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_history)


HISTORY_COLUMNS = ("started_at", "job", "outcome", "reason", "duration", "host", "exit/error")


def cmd_history(args: argparse.Namespace) -> int:
    from ..errors import NotMigratedError  # noqa: PLC0415
    from ..jobs.record import history, skip_warnings_of  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:history") as conn,
    ):
        try:
            rows = history(conn, job=args.job, limit=args.limit)
        except NotMigratedError as exc:
            raise CliError(
                f"no ledger in {db.label}: run pgsolo migrate first", EXIT_USAGE, "not-migrated"
            ) from exc
        name, server = where(conn)
        warnings = skip_warnings_of(conn, (str(row["job"]) for row in rows))
    if args.json:
        emit_json(
            "history",
            {
                "database": name,
                "server": server,
                "attempts": [attempt_as_json(row) for row in rows],
                "warnings": warnings,
            },
        )
        return EXIT_OK
    if not rows:
        print("no attempts recorded" + (f" for job {args.job}" if args.job else ""))
    else:
        print_table([HISTORY_COLUMNS, *(_history_line(row) for row in rows)])
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return EXIT_OK


def attempt_as_json(row: dict[str, Any]) -> dict[str, Any]:
    """A ledger row in the ``--json`` vocabulary: ``key``, and seconds (the table keeps
    milliseconds)."""
    out = {("key" if name == "lock_key" else name): value for name, value in row.items()}
    for ms in ("duration_ms", "lock_wait_ms"):
        value = out.pop(ms, None)
        out[ms.removesuffix("_ms") + "_seconds"] = None if value is None else float(value) / 1000
    return out


def _history_line(row: dict[str, Any]) -> tuple[str, ...]:
    started = str(row.get("started_at") or "")
    with suppress(ValueError):
        started = datetime.fromisoformat(started).isoformat(sep=" ", timespec="seconds")
    duration = row.get("duration_ms")
    exit_code, error = row.get("exit_code"), row.get("error")
    detail = " ".join(str(x) for x in (exit_code, error) if x is not None)
    return (
        started,
        str(row.get("job") or ""),
        str(row.get("outcome") or ""),
        str(row.get("reason") or ""),
        f"{float(duration) / 1000:.3f}s" if duration is not None else "",
        str(row.get("host") or ""),
        detail,
    )
