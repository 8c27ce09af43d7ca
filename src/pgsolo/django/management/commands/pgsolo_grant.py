"""``manage.py pgsolo_grant ROLE [ROLE ...] [--database ALIAS]``: ``pgsolo migrate
--grant-to ROLE`` for tables that ``manage.py migrate`` made, for a role that came after
them (``settings.PGSOLO_GRANT_TO`` grants its roles as the migrations make the tables)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from ....cli.exit_codes import exit_code_of
from ....drivers import django_connection
from ....errors import NotMigratedError, PgsoloError
from ....schema import LATEST_VERSION, check_roles, migrate_to, schema_version


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Grant each ROLE the least privileges every pgsolo feature needs on pgsolo's tables"
        " (docs/security.md), as `pgsolo migrate --grant-to ROLE` does. Run it as the role"
        " that ran `manage.py migrate` (the tables' owner)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("roles", nargs="+", metavar="ROLE", help="a role to grant")
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="the database of settings.DATABASES whose pgsolo tables to grant"
            f' (default: "{DEFAULT_DB_ALIAS}")',
        )

    def handle(self, *args: Any, roles: list[str], database: str, **options: Any) -> str:
        try:
            granted = check_roles(roles)
            connection = django_connection(database)
            version = schema_version(connection)
            if version < LATEST_VERSION:
                # The grants name every table of the latest version.
                raise NotMigratedError(
                    f"pgsolo's tables in database {database!r} are at version {version},"
                    f" and this pgsolo's at {LATEST_VERSION}: run `manage.py migrate"
                    f" --database {database}` first",
                    version=version,
                )
            migrate_to(connection, version, grant_to=granted)
        except PgsoloError as exc:
            raise CommandError(f"pgsolo: {exc}", returncode=exit_code_of(exc)) from exc
        return f"granted pgsolo's privileges in database {database!r} to {', '.join(granted)}"
