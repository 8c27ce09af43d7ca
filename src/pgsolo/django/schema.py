"""pgsolo's tables through Django's migrations: the app's migrations (``migrations/``) are
one per version of :mod:`pgsolo.schema`, each :func:`to_version`'s operation.

The operation runs pgsolo's own migrations (never a copy of their SQL) on the connection
Django migrates, in the transaction of Django's migration, so the version and Django's
record of it commit together; a database that ``pgsolo migrate`` brought there already is
left as it is. Django's router decides where it runs (``allow_migrate`` with app label
``pgsolo``), as for any ``RunPython``. On a database of another vendor it does nothing,
as Django's own ``django.contrib.postgres`` operations do: the migration is recorded, and
pgsolo refuses that database's connections when they are used. No migration is reversible:
pgsolo has no downgrade, and its tables hold the ledger and the operations' results.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import migrations

from ..errors import InvalidArgumentError
from ..schema import LATEST_VERSION, check_roles, migrate_to

__all__ = ["GRANT_SETTING", "to_version"]

GRANT_SETTING = "PGSOLO_GRANT_TO"


def to_version(version: int) -> Any:
    """The operation of the migration of pgsolo's schema ``version``: a ``RunPython``
    that brings the database Django migrates to that version, with pgsolo's migrations.

    The roles of ``settings.PGSOLO_GRANT_TO`` are checked before any SQL, and granted
    (``pgsolo migrate --grant-to``'s privileges) by the migration of the latest version,
    once every table they name is there."""

    def forward(apps: object, schema_editor: Any) -> None:
        roles = granted_roles()
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            return
        grants = roles if version >= LATEST_VERSION else ()
        try:
            migrate_to(connection, version, grant_to=grants)
        except InvalidArgumentError:
            if not grants:
                raise
            # The roles were checked as names: the server has no role of one of them.
            # Said here, not in pgsolo migrate's words ("nothing was migrated"): there one
            # transaction holds every version, here each is a migration of its own.
            raise InvalidArgumentError(
                f"settings.{GRANT_SETTING}: no such role in this database"
                f" ({', '.join(grants)}): create it (CREATE ROLE ... LOGIN), then run"
                f" migrate again. pgsolo's migration to version {version} was rolled back"
                " with its grants; the migrations before it stay applied"
            ) from None

    # What `manage.py migrate --plan` shows of the operation.
    forward.__doc__ = f"pgsolo's schema to version {version}"
    return migrations.RunPython(forward)


def granted_roles() -> tuple[str, ...]:
    """``settings.PGSOLO_GRANT_TO`` (a list of role names; none when unset), checked."""
    roles = getattr(settings, GRANT_SETTING, ())
    if not isinstance(roles, str | list | tuple):
        raise InvalidArgumentError(
            f"settings.{GRANT_SETTING} is a list of role names, got {roles!r}"
        )
    try:
        return check_roles(roles)
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"settings.{GRANT_SETTING}: {exc}") from None
