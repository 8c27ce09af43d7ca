"""``pgsolo dashboard``: serve :func:`pgsolo.dashboard.create_app` with uvicorn."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    connection,
    database,
    int_between,
    seconds_between,
    where,
)
from .exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from .locks import add_naming_arguments, naming_arguments

TOKEN_VARIABLE = "PGSOLO_DASHBOARD_TOKEN"  # noqa: S105 - where the token is, not one

INSTALL = "pip install 'pgsolo[dashboard]'"


def add_dashboard_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "dashboard",
        description="Serve a web dashboard of the database: every advisory lock held or"
        " waited for (names, holders, wait chains, semaphores, leaders, leak suspects), the"
        " ledger's jobs, run_once's operations and the doctor's checklist, each page"
        " refreshing itself, with its JSON under /api/ and Prometheus metrics at /metrics."
        " Keys are named as pgsolo locks names them (--registry, --name, --semaphore)."
        " Read-only unless --allow-terminate, which needs the token printed at start (or"
        f" ${TOKEN_VARIABLE}). Binds 127.0.0.1 unless --host says otherwise. Needs the"
        f" extra: {INSTALL}. Runs until interrupted.",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name requests may be addressed to (their Host header), besides the"
        " address of --host (and localhost, on a loopback address); any other is refused,"
        " so that no other site can read the dashboard through DNS rebinding. Repeat for"
        " several; *.example.com for a domain's. With --host 0.0.0.0 (or ::) and none"
        " given, any",
    )
    parser.add_argument("--port", type=int_between(1, 65535), default=8765, help="default: 8765")
    parser.add_argument(
        "--allow-terminate",
        action="store_true",
        help="offer to terminate a lock holder, from a confirmation page, to who gives the"
        f" token (${TOKEN_VARIABLE}, else a new one printed at start)",
    )
    parser.add_argument(
        "--refresh",
        type=seconds_between(1, 3600),
        default=5.0,
        metavar="SECONDS",
        help="how often each page refreshes itself (default: 5)",
    )
    add_naming_arguments(parser)
    add_dsn_argument(parser)
    parser.set_defaults(handler=cmd_dashboard)


_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def allowed_hosts(host: str, given: list[str]) -> list[str] | None:
    """The Host headers the dashboard bound to ``host`` answers: ``host`` itself, the
    names of this machine's loopback when it is one, and those ``given``. None (any) only
    for a wildcard address without any given: it is reached by names pgsolo cannot know."""
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:  # a name: the one it is reached by
        return [host, *given]
    if address.is_unspecified:
        return given or None
    names = [host, f"[{address}]" if address.version == 6 else str(address), *given]
    if address.is_loopback:
        names += _LOOPBACK_NAMES
    return list(dict.fromkeys(names))


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: PLC0415 - the extra's, only when the command runs

        from ..dashboard import create_app  # noqa: PLC0415
        from ..dashboard.guard import new_token  # noqa: PLC0415
        from ..dashboard.reads import Naming  # noqa: PLC0415
    except ImportError as exc:
        raise CliError(
            f"the dashboard needs the extra pgsolo[dashboard] ({exc.name or exc} is missing):"
            f" {INSTALL}",
            EXIT_USAGE,
        ) from None
    registry, names, semaphores = naming_arguments(args)
    Naming.of(registry, names, semaphores)  # a name that is no key's: before connecting
    token = None
    if args.allow_terminate:
        token = os.environ.get(TOKEN_VARIABLE) or new_token()
    with database(args.dsn, connect_timeout=args.connect_timeout) as db:
        with connection(db, "pgsolo:dashboard") as conn:  # a wrong DSN fails now, exit 69
            name, server = where(conn)
        app = create_app(
            db.dsn,
            allowed_hosts=allowed_hosts(args.host, args.allowed_host),
            allow_terminate=args.allow_terminate,
            token=token,
            refresh_seconds=args.refresh,
            connect_timeout=db.connect_timeout,
            registry=registry,
            names=names,
            semaphores=semaphores,
        )
        host = f"[{args.host}]" if ":" in args.host else args.host
        print(f"pgsolo dashboard: database {name} on {server}", file=sys.stderr)
        print(f"  http://{host}:{args.port}/", file=sys.stderr)
        if token is not None and not os.environ.get(TOKEN_VARIABLE):
            print(f"  terminate token: {token}", file=sys.stderr)
        if token is not None and not _loopback(args.host):
            print(
                f"pgsolo dashboard: warning: --allow-terminate on {args.host}: the token and"
                " the pages travel as plain HTTP to whoever reaches this address; serve it"
                " behind a proxy with TLS and a login",
                file=sys.stderr,
            )
        sys.stderr.flush()
        try:
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
        except SystemExit as exc:  # uvicorn's own exit: it could not start serving
            if exc.code in (0, None):
                raise
            raise CliError(
                f"could not serve on {host}:{args.port} (the port is taken, or this machine"
                " has no such address)",
                EXIT_FAILED,
            ) from None
    return EXIT_OK


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
