"""``pgsolo prune``: delete what pgsolo's tables would keep for ever, by age."""

from __future__ import annotations

import argparse

from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    connection,
    database,
    int_between,
    where,
)
from .exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .output import emit_json


def add_prune_command(subparsers: Subparsers) -> None:
    from ..schema.retention import DEFAULT_PRUNE_BATCH, MAX_PRUNE_BATCH  # noqa: PLC0415

    parser = add_command(
        subparsers,
        "prune",
        description="Delete, oldest first and in short batches (each its own transaction,"
        " so nothing holds back VACUUM), what pgsolo's tables keep that is older than"
        " --older-than by the database's clock: the ledger's attempts, and once-per-period"
        " records a later period of the same job superseded (the latest of each job stays,"
        " so a period still going still skips a second run); with --operations, finished"
        " run_once keys too (a pruned key runs again if asked again: only for keys nobody"
        " asks for after that long, such as a key per scheduled occurrence). Run it as"
        " the role that ran pgsolo migrate. Exit codes: 0 done; 1 refused (privileges);"
        " 2 usage error or no pgsolo tables; 69 database unavailable; 78 the server is a"
        " standby (a --dry-run counts there).",
    )
    parser.add_argument(
        "--older-than",
        type=_age,
        required=True,
        metavar="AGE",
        help="how old what is deleted must be: 90d, 2w, 24h, 15m or a number of seconds",
    )
    parser.add_argument(
        "--operations",
        action="store_true",
        help="also delete finished operation keys (run_once) older than AGE",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )
    parser.add_argument(
        "--batch",
        type=int_between(1, MAX_PRUNE_BATCH),
        default=DEFAULT_PRUNE_BATCH,
        metavar="N",
        help=f"rows per batch (default: {DEFAULT_PRUNE_BATCH})",
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_prune)


def _age(text: str) -> float:
    """``--older-than``: a length of time as a period of seconds is spelt (90d, 2w...)."""
    from .._types import read_period  # noqa: PLC0415
    from ..errors import InvalidArgumentError  # noqa: PLC0415

    try:
        seconds = read_period(text).seconds
    except InvalidArgumentError:
        seconds = None
    if seconds is None:
        raise argparse.ArgumentTypeError(
            f"an age is a length of time, 90d, 2w, 24h, 15m or a number of seconds, got {text!r}"
        )
    return float(seconds)


def cmd_prune(args: argparse.Namespace) -> int:
    from ..errors import InsufficientPrivilegeError, NotMigratedError  # noqa: PLC0415
    from ..schema.retention import prune  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:prune") as conn,
    ):
        try:
            pruned = prune(
                conn,
                args.older_than,
                operations=args.operations,
                batch=args.batch,
                dry_run=args.dry_run,
            )
        except NotMigratedError as exc:
            raise CliError(
                f"no pgsolo tables in {db.label}: nothing to prune", EXIT_USAGE, "not-migrated"
            ) from exc
        except InsufficientPrivilegeError as exc:
            raise CliError(str(exc), EXIT_FAILED, "insufficient-privilege") from exc
        name, server = where(conn)
    counts = {"runs": pruned.runs, "periods": pruned.periods}
    if args.operations:
        counts["operations"] = pruned.operations
    if args.json:
        emit_json(
            "prune",
            {
                "database": name,
                "server": server,
                "older_than_seconds": args.older_than,
                "dry_run": args.dry_run,
                "rows": counts,
            },
        )
        return EXIT_OK
    verb = "would delete" if args.dry_run else "deleted"
    shown = ", ".join(f"{count} {what}" for what, count in counts.items())
    print(f"pgsolo prune: {verb} {shown} older than {args.older_than:.0f}s in {db.label}")
    return EXIT_OK
