"""``pgsolo migrate``: create or upgrade pgsolo's tables."""

from __future__ import annotations

import argparse

from ..errors import (
    LockTimeoutError,
)
from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    connection,
    database,
    where,
)
from .exit_codes import (
    EXIT_OK,
    EXIT_SKIPPED,
)
from .output import emit_json


def add_migrate_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "migrate",
        description="Create or upgrade the tables in the pgsolo schema that --record,"
        " --once-per and `pgsolo history` use. Idempotent, and safe to run from many hosts"
        " at once: versions are applied in order under an advisory lock of their own, which"
        " it waits up to 120 s for. Exit codes: 0 done; 1 refused (privileges); 2 usage"
        " error (a --grant-to role that does not exist); 69 database unavailable; 75 another"
        " pgsolo migrate kept its lock for 120 s; 78 the server is a standby.",
    )
    parser.add_argument(
        "--grant-to",
        metavar="ROLE",
        action="append",
        default=[],
        help="also grant ROLE (an application's; repeatable) the least privileges every"
        " pgsolo feature needs on these tables, in the same transaction; give it again on"
        " each upgrade (docs/security.md)",
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_migrate)


def cmd_migrate(args: argparse.Namespace) -> int:
    from ..schema import check_roles, migrate, schema_version  # noqa: PLC0415

    roles = check_roles(args.grant_to)  # a bad name is a usage error before connecting

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:migrate") as conn,
    ):
        try:
            applied = migrate(conn, grant_to=roles)
        except LockTimeoutError as exc:
            raise CliError(
                f"another pgsolo migrate kept {db.label} busy for {exc.timeout:g}s", EXIT_SKIPPED
            ) from exc
        version = schema_version(conn)
        name, server = where(conn)
    if args.json:
        emit_json(
            "migrate",
            {
                "database": name,
                "server": server,
                "applied": applied,
                "schema_version": version,
                "granted_to": list(roles),
            },
        )
    elif applied:
        versions = ", ".join(str(v) for v in applied)
        print(f"applied migration {versions}: pgsolo schema version {version} on {db.label}")
    else:
        print(f"up to date: pgsolo schema version {version} on {db.label}")
    if roles and not args.json:
        print(f"granted pgsolo's privileges to {', '.join(roles)}")
    return EXIT_OK
