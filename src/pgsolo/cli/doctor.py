"""``pgsolo doctor``: the production checklist against a live database."""

from __future__ import annotations

import argparse

from ..monitor.checks import DEFAULT_SNAPSHOT_OLDER_THAN, MAX_OLDER_THAN
from .common import (
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    connection,
    database,
    seconds_between,
    where,
)
from .exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
)
from .output import emit_json


def add_doctor_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "doctor",
        description="Check the database against the advisory-lock production checklist and"
        " print each check as ok, warn or fail with one line of advice: idle sessions"
        " holding session locks, idle or long transactions holding locks, any session whose"
        " old transaction or snapshot holds back VACUUM, the shared lock"
        " table's capacity, connections without an application_name, idle timeouts that"
        " end lock holders, lock_timeout, a pooling proxy, PUBLIC's EXECUTE on the"
        " advisory-lock functions, and a server in recovery (a standby, where no lock"
        " coordinates anything); and it names each leader, how long it has led and its"
        " waiting candidates. Exit codes: 0 no check failed (warnings allowed);"
        " 1 at least one check failed; 69 database unavailable; 2 usage error.",
    )
    parser.add_argument(
        "--older-than",
        type=seconds_between(0, MAX_OLDER_THAN),
        default=300.0,
        metavar="SECONDS",
        help="an idle session or open transaction holding a lock, or a wait, older than this"
        " is suspect (default: 300)",
    )
    parser.add_argument(
        "--snapshot-older-than",
        type=seconds_between(0, MAX_OLDER_THAN),
        default=DEFAULT_SNAPSHOT_OLDER_THAN,
        metavar="SECONDS",
        help="a session (any, advisory locks or not) whose transaction has held a snapshot or"
        " a transaction id, or sat idle, for longer than this holds back VACUUM"
        f" (default: {DEFAULT_SNAPSHOT_OLDER_THAN:g})",
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_doctor)


DOCTOR_MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..monitor.checks import doctor  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:doctor") as conn,
    ):
        checks = doctor(
            conn, older_than=args.older_than, snapshot_older_than=args.snapshot_older_than
        )
        name, server = where(conn)
    code = EXIT_FAILED if any(check.status == "fail" for check in checks) else EXIT_OK
    if args.json:
        emit_json(
            "doctor",
            {
                "database": name,
                "server": server,
                "exit_code": code,
                "checks": [c.as_dict() for c in checks],
            },
        )
        return code
    print(f"pgsolo doctor: {db.label}")
    for check in checks:
        print(f"[{DOCTOR_MARKS[check.status]}] {check.name}: {check.detail}")
        if check.advice:
            print(f"       advice: {check.advice}")
    return code
