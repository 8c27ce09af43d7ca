"""``pgsolo locks``: who holds which advisory lock, and who waits behind whom."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..keys import Key
from .exit_codes import (
    EXIT_OK,
    EXIT_USAGE,
)

if TYPE_CHECKING:
    from ..keys import Registry
    from ..monitor import AdvisoryLock
from .common import (
    CliError,
    Subparsers,
    add_command,
    add_dsn_argument,
    add_json_argument,
    add_key_is_name_argument,
    connection,
    database,
    emit_json,
    print_table,
)


def add_locks_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "locks",
        help="who holds which advisory lock, since when, and who waits behind whom",
        description="List every advisory lock of the database, held and waiting: the key"
        " (int64 or N:R), its name (from --registry, or a --name whose key spec v1 key"
        " matches), exclusive or shared, lifetime where the server proves it, the backend"
        " (pid, application_name, client, state), how long it has been held or waited"
        " for, its current query, and the wait chains (pg_blocking_pids). One query;"
        " exit code 0.",
    )
    parser.add_argument(
        "--registry", metavar="FILE", help="a TOML registry of names ([locks], [namespaces])"
    )
    parser.add_argument(
        "--name",
        action="append",
        default=[],
        metavar="NAME",
        help="label the key NAME derives to (an int64, or N:<its int32> in any namespace);"
        " repeatable",
    )
    parser.add_argument("--key", metavar="KEY", help="only this key: a name, an int64 or N:R")
    add_key_is_name_argument(parser)
    add_dsn_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_locks)


LOCKS_COLUMNS = (
    "KEY",
    "NAME",
    "MODE",
    "LIFETIME",
    "STATUS",
    "PID",
    "APPLICATION",
    "CLIENT",
    "STATE",
    "FOR",
    "BLOCKED BY",
    "QUERY",
)


QUERY_WIDTH = 60  # characters of the current query in the table (--json has more)


def cmd_locks(args: argparse.Namespace) -> int:
    from ..monitor.locks import advisory_locks, wait_chains  # noqa: PLC0415

    registry = load_registry(args.registry) if args.registry else None
    key = Key.parse(args.key, name=args.key_is_name) if args.key is not None else None
    names = list(args.name)
    if key is not None and key.name is not None:
        names.append(key.name)  # the rows --key NAME selects are labelled with it
    if registry is not None and key is not None and key.name is not None:
        key = registry.resolve(key.name)
    with (
        database(args.dsn, connect_timeout=args.connect_timeout) as db,
        connection(db, "pgsolo:locks") as conn,
    ):
        locks = advisory_locks(conn, registry=registry, names=names, key=key)
    chains = wait_chains(locks)
    if args.json:
        emit_json(
            {
                "database": db.label,
                "locks": [lock.as_dict() for lock in locks],
                "wait_chains": [list(chain) for chain in chains],
            }
        )
        return EXIT_OK
    held = sum(1 for lock in locks if lock.granted)
    print(f"{held} held, {len(locks) - held} waiting: advisory locks in {db.label}")
    if locks:
        print_table([LOCKS_COLUMNS, *(lock_line(lock) for lock in locks)])
    if chains:
        print("wait chains (each pid waits for the next; the last one holds the lock):")
        for chain in chains:
            print("  " + " -> ".join(str(pid) for pid in chain))
    return EXIT_OK


def load_registry(path: str) -> Registry:
    from ..keys import Registry  # noqa: PLC0415

    try:
        return Registry.from_toml(path)
    except OSError as exc:
        raise CliError(f"cannot read the registry {path}: {exc.strerror}", EXIT_USAGE) from exc


def lock_line(lock: AdvisoryLock) -> tuple[str, ...]:
    from ..monitor.snapshot import format_seconds  # noqa: PLC0415

    age = lock.age_seconds
    since = f"{format_seconds(age)} ({lock.since_source})" if age is not None else ""
    query = lock.query or ""
    return (
        lock.key.text,
        lock.name or "",
        "shared" if lock.shared else "exclusive",
        lock.lifetime or "?",
        "held" if lock.granted else "waiting",
        str(lock.pid) if lock.pid is not None else "(prepared)",
        lock.application_name or "",
        lock.client_addr or ("local" if lock.state is not None else ""),
        lock.state or "",
        since,
        ",".join(str(pid) for pid in lock.blocked_by),
        query if len(query) <= QUERY_WIDTH else query[: QUERY_WIDTH - 3] + "...",
    )
