"""``pgsolo terminate``: end a lock holder, after showing what it holds and asking."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

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
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
)
from .locks import client_of, lock_table
from .output import emit_json

if TYPE_CHECKING:
    from ..monitor import AdvisoryLock


def add_terminate_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "terminate",
        description="Show what backend PID holds and waits for, ask for confirmation on the"
        " terminal, then end it with pg_terminate_backend: its session ends, its"
        " transaction rolls back and every lock it holds is released. Refuses a PID that"
        " holds no advisory lock in this database unless --force. Without a terminal on"
        " stdin, --yes is required. Exit codes: 0 terminated and its locks are gone;"
        " 1 declined, or the backend did not end; 2 usage error (including no terminal"
        " and no --yes, or nothing held without --force); 69 database unavailable.",
    )
    parser.add_argument("pid", type=int_between(1, 2**31 - 1), metavar="PID")
    parser.add_argument("--yes", action="store_true", help="do not ask (for scripts)")
    parser.add_argument(
        "--force", action="store_true", help="terminate PID even if it holds no advisory lock"
    )
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_terminate)


TERMINATE_WAIT_MS = 5000  # how long pg_terminate_backend waits for the backend to be gone


def cmd_terminate(args: argparse.Namespace) -> int:
    from ..monitor import advisory_locks  # noqa: PLC0415
    from ..monitor.terminate import terminate_backend  # noqa: PLC0415

    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:terminate") as conn,
    ):
        if args.pid == conn.info.backend_pid:
            raise CliError(f"pid {args.pid} is this command's own session", EXIT_USAGE)
        locks = advisory_locks(conn, pid=args.pid)
        held = [lock for lock in locks if lock.granted]
        if not held and not args.force:
            waits = " (it only waits for one)" if locks else ""
            raise CliError(
                f"pid {args.pid} holds no advisory lock in {db.label}{waits}; nothing to"
                " release (--force terminates it anyway)",
                EXIT_USAGE,
            )
        name, server = where(conn)
        if not args.json:  # the locks are in the document; a question, if any, on stderr
            _show(args.pid, locks, db.label)
        report: dict[str, object] = {
            "database": name,
            "server": server,
            "pid": args.pid,
            "locks": [lock.as_dict() for lock in locks],
        }
        if not args.yes and not _confirmed(args.pid):
            if args.json:
                emit_json("terminate", {**report, "terminated": False, "locks_left": None})
            else:
                print(f"not terminated: pid {args.pid}")
            return EXIT_FAILED
        if not args.yes:  # what it holds may have changed while the question waited
            locks = advisory_locks(conn, pid=args.pid)
            held = [lock for lock in locks if lock.granted]
            report["locks"] = [lock.as_dict() for lock in locks]
        # Asked again in the termination's own statement: never a session that let go.
        ended = terminate_backend(
            conn, args.pid, wait_ms=TERMINATE_WAIT_MS, only_holding=not args.force
        )
        left = advisory_locks(conn, pid=args.pid)
        if not ended and not args.force and not any(lock.granted for lock in left):
            raise CliError(
                f"pid {args.pid} let go of its advisory locks before it was terminated, so"
                " it was not (--force terminates it anyway)",
                EXIT_USAGE,
            )
    if args.json:
        emit_json("terminate", {**report, "terminated": ended, "locks_left": len(left)})
        return EXIT_OK if ended and not left else EXIT_FAILED
    if not ended:
        print(
            f"pgsolo terminate: pid {args.pid} did not end within"
            f" {TERMINATE_WAIT_MS / 1000:g}s (or is not a backend of this server)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if left:
        print(
            f"pgsolo terminate: pid {args.pid} ended but {len(left)} locks still show",
            file=sys.stderr,
        )
        return EXIT_FAILED
    waited = len(locks) - len(held)
    ended_waits = f", {waited} wait(s) ended" if waited else ""
    print(f"terminated pid {args.pid}: {len(held)} advisory lock(s) released{ended_waits}")
    return EXIT_OK


def _show(pid: int, locks: list[AdvisoryLock], label: str) -> None:
    """What ``pid`` holds and waits for, and who it is, as the question's context."""
    if not locks:
        print(f"pid {pid} holds no advisory lock in {label} (--force)")
        return
    first = locks[0]
    app = repr(first.application_name) if first.application_name else "no application_name"
    print(
        f"pid {pid} ({app}, client {client_of(first) or 'hidden'}, state"
        f" {first.state or 'hidden'}) in {label}:"
    )
    print_table(lock_table(locks, wide=False))


def _confirmed(pid: int) -> bool:
    if not sys.stdin.isatty():
        raise CliError(
            "stdin is not a terminal, so pgsolo cannot ask for confirmation; pass --yes to"
            f" terminate pid {pid} without asking",
            EXIT_USAGE,
        )
    print(
        f"terminate pid {pid}? Its session ends, its transaction rolls back and its locks"
        " are released. [y/N] ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    return sys.stdin.readline().strip().lower() in ("y", "yes")
