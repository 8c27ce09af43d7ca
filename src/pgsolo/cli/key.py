"""``pgsolo key``: the key of a name, and the SQL that takes it from psql."""

from __future__ import annotations

import argparse
from typing import Any

from ..keys import Key
from ..sql import name_to_sql
from .common import (
    Subparsers,
    add_command,
    add_json_argument,
    add_key_is_name_argument,
)
from .exit_codes import (
    EXIT_OK,
)
from .output import emit_json


def add_key_command(subparsers: Subparsers) -> None:
    parser = add_command(
        subparsers,
        "key",
        description="Show the advisory-lock key of KEY (key spec v1) and the SQL that takes"
        " the same lock from psql. KEY is a name (daily-settlement), an int64 (123) or a"
        " pair (42:1001).",
    )
    parser.add_argument("key", metavar="KEY", help="a name, an int64 or a pair N:R")
    add_key_is_name_argument(parser)
    parser.add_argument(
        "--namespace",
        type=int,
        metavar="N",
        help="derive the pair (N, int32 of the name) instead of an int64 (names only)",
    )
    add_json_argument(parser)
    parser.set_defaults(handler=cmd_key)


def describe_key(key: Key) -> dict[str, Any]:
    """What ``pgsolo key`` reports. ``key`` is the command-line form, a string: an int64
    does not survive a trip through a JSON parser that reads numbers as doubles."""
    namespace, resource = key.value if isinstance(key.value, tuple) else (None, None)
    numeric = f"SELECT pg_try_advisory_lock({key.sql_args});"
    derived = (
        f"SELECT pg_try_advisory_lock({name_to_sql(key.name, namespace=namespace)});"
        if key.name is not None
        else numeric
    )
    return {
        "name": key.name,
        "key": key.text,
        "namespace": namespace,
        "resource": resource,
        "sql": derived,
        "sql_numeric": numeric,
    }


def cmd_key(args: argparse.Namespace) -> int:
    key = Key.parse(args.key, namespace=args.namespace, name=args.key_is_name)  # exit 2
    info = describe_key(key)
    if args.json:
        emit_json("key", info)
        return EXIT_OK
    kind = (
        f"pair: namespace {info['namespace']}, resource {info['resource']}"
        if key.is_pair
        else "int64"
    )
    source = f"{key.name!r} -> " if key.name is not None else ""
    print(f"{source}key {key.text} ({kind})")
    print("-- take it from psql (a session lock; pg_advisory_unlock releases it):")
    if key.name is not None:
        print(info["sql"])
    print(info["sql_numeric"])
    return EXIT_OK
