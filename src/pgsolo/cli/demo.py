"""``pgsolo demo``: the article's opening scenario on the embedded server."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..dsn import EMBEDDED
from ..errors import (
    LockTimeoutError,
)
from .exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SKIPPED,
)
from .output import emit_json

if TYPE_CHECKING:
    from ..demo import DemoResult
from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    connection,
    database,
    int_between,
    seconds_between,
    where,
)


def add_demo_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "demo",
        description="The article's opening scenario: N worker processes wake up at the same"
        " instant and race for the daily settlement; pgsolo.xact_lock lets one run it and"
        " the others skip. Exits 0 when exactly one worker did the work and no row was"
        " processed twice.",
    )
    parser.add_argument(
        "--workers", type=int_between(1, 64), default=4, metavar="N", help="default: 4"
    )
    parser.add_argument(
        "--work-seconds",
        type=seconds_between(0, 3600),
        default=1.5,
        metavar="S",
        help="how long the winner keeps working with the lock held (default: 1.5)",
    )
    parser.add_argument(
        "--rows", type=int_between(1, 1_000_000), default=20, metavar="N", help="default: 20"
    )
    add_dsn_argument(
        parser,
        help="run on this server instead of the embedded one (the demo drops and creates"
        " the table pgsolo_demo_settlements there; it never reads $PGSOLO_DSN or"
        " $DATABASE_URL)",
    )
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import JOB_KEY, TABLE, format_report, run_demo  # noqa: PLC0415

    with database(args.dsn, default=EMBEDDED) as db:
        if not args.json:
            print(
                f"pgsolo demo: {args.workers} worker processes race for {JOB_KEY!r} on"
                f" {db.label}; table {TABLE} has {args.rows} pending settlements",
                flush=True,
            )
        try:
            result = run_demo(
                db.dsn,
                workers=args.workers,
                work_seconds=args.work_seconds,
                rows=args.rows,
                log_level=args.log_level,
                log_format=args.log_format,
            )
        except LockTimeoutError as exc:
            raise CliError(
                f"another pgsolo demo kept {db.label} busy for {exc.timeout:g}s", EXIT_SKIPPED
            ) from exc
        if args.json:
            with connection(db, "pgsolo:demo") as conn:
                _, server = where(conn)
            document = {"server": server, "exit_code": exit_code(result), **result.as_dict()}
            emit_json("demo", document)
            return exit_code(result)
    format_report(result)
    return exit_code(result)


def exit_code(result: DemoResult) -> int:
    return EXIT_OK if result.ok else EXIT_FAILED
