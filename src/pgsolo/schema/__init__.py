"""pgsolo's own tables, and ``pgsolo migrate``, which creates and upgrades them.

They are opt-in: nothing is created until ``pgsolo migrate`` (or :func:`migrate`) runs.
Each version is a ``.sql`` file in ``migrations/`` named ``NNNN_what.sql``. Migrating is
idempotent and safe from many hosts at once: every version is applied in order, in one
transaction that holds an advisory lock of its own, and recorded in
``pgsolo.schema_migrations``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from typing import TYPE_CHECKING

from .. import sql
from ..drivers import DriverBase, TxStatus, adapt_sync
from ..errors import InsufficientPrivilegeError, InvalidArgumentError
from ..keys import Key, from_name
from ..locking import LockSpec, drive, lock_core, outside_transaction
from ..locking.plans import Plan

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike

__all__ = [
    "LATEST_VERSION",
    "MIGRATIONS",
    "MIGRATION_KEY",
    "Pruned",
    "migrate",
    "migrate_to",
    "prune",
    "schema_version",
    "version_plan",
]

MIGRATION_KEY: Key = from_name("pgsolo:migrate")
MIGRATION_WAIT_SECONDS = 120
MAX_ROLE_BYTES = 63  # NAMEDATALEN - 1


def _load_migrations() -> tuple[tuple[int, str], ...]:
    folder = resources.files(__package__) / "migrations"
    found = sorted(
        (int(entry.name.split("_", 1)[0]), entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    versions = [version for version, _ in found]
    if versions != list(range(1, len(found) + 1)):  # a packaging mistake, not a user's
        raise RuntimeError(f"pgsolo's migrations are not numbered 1..N: {versions}")
    return tuple(found)


MIGRATIONS: tuple[tuple[int, str], ...] = _load_migrations()
"""``(version, SQL)`` for every migration, in order."""
LATEST_VERSION = MIGRATIONS[-1][0]


def _migrate_plan(
    driver: DriverBase, grant_to: Sequence[str] = (), upto: int = LATEST_VERSION
) -> Plan[list[int]]:
    core = lock_core(driver, LockSpec(MIGRATION_KEY, "xact", MIGRATION_WAIT_SECONDS * 1000))
    yield from core.acquire(context=True)
    try:
        current = yield [sql.MIGRATIONS_TABLE, sql.SCHEMA_VERSION]
        applied = [version for version, _ in MIGRATIONS if int(str(current)) < version <= upto]
        for version, body in MIGRATIONS:
            if version in applied:
                yield [body, sql.record_migration(version)]
        if grant_to:
            # In the migrations' transaction: an upgrade's new tables are granted as
            # they appear, and a role that does not exist undoes the whole run.
            yield [grant for role in grant_to for grant in sql.grants(role)]
    except BaseException as exc:
        yield from core.exit(failed=True)
        refused = yield from _refused(driver, exc, grant_to)
        if refused is None:
            raise
        raise refused from exc
    yield from core.exit(failed=False)
    return applied


def _refused(
    driver: DriverBase, exc: BaseException, grant_to: Sequence[str]
) -> Plan[Exception | None]:
    """pgsolo's error for a migration the server refused, or None."""
    meaning = sql.meaning(driver.sqlstate(exc))
    info = driver.server_info()
    if meaning is sql.Meaning.UNDEFINED_OBJECT and grant_to:  # only a role can be missing
        roles = ", ".join(grant_to)
        return InvalidArgumentError(
            f"--grant-to/grant_to: no such role in {info.address} ({roles}): create it"
            " first (CREATE ROLE ... LOGIN); nothing was migrated or granted"
        )
    if meaning is not sql.Meaning.NO_PRIVILEGE or not isinstance(exc, Exception):
        return None
    owner = yield from _other_owner(driver)
    if owner is not None:
        # No GRANT makes another role the owner's equal short of membership in it, which
        # may be a superuser's: the fix is to run it as the owner.
        return InsufficientPrivilegeError(
            f"schema {sql.SCHEMA} belongs to role {owner!r}, and only its owner can create"
            f" and alter pgsolo's tables in it, which role {info.user!r} cannot (permission"
            f" denied, SQLSTATE 42501): run pgsolo migrate as {owner!r}. Nothing was migrated."
        )
    needs = (
        f"GRANT CREATE ON DATABASE {sql.quote_name(info.database)} TO {sql.quote_name(info.user)}",
    )
    return InsufficientPrivilegeError(
        f"pgsolo migrate needs to create schema {sql.SCHEMA} (CREATE on database"
        f" {info.database!r}) and to create and grant tables in it (their owner), which role"
        f" {info.user!r} cannot (permission denied, SQLSTATE 42501): run it as the owner of"
        f" the database, or of schema {sql.SCHEMA} once it exists; or {needs[0]}."
        " Nothing was migrated.",
        needs=needs,
    )


def _other_owner(driver: DriverBase) -> Plan[str | None]:
    """The role that owns schema pgsolo, if it exists and another role does; None when
    it does not, or when that cannot be asked (the caller's transaction failed)."""
    if driver.transaction_status() is not TxStatus.IDLE:
        return None
    try:
        owner = yield outside_transaction(driver, [sql.SCHEMA_OWNER])
    except Exception:
        return None
    return None if owner is None else str(owner)


def check_roles(grant_to: Sequence[str]) -> tuple[str, ...]:
    """``grant_to`` as a tuple of role names, each checked before any SQL is sent."""
    if isinstance(grant_to, str):
        grant_to = (grant_to,)
    if not isinstance(grant_to, Iterable):
        raise InvalidArgumentError(f"grant_to takes role names, got {grant_to!r}")
    for role in grant_to:
        if not isinstance(role, str) or not role or "\0" in role:
            raise InvalidArgumentError(f"grant_to: a role name is non-empty text, got {role!r}")
        try:
            encoded = role.encode("utf-8")
        except UnicodeEncodeError:  # bytes of another encoding, from the command line
            raise InvalidArgumentError(
                f"grant_to: a role name is valid Unicode text, got {role!r}"
            ) from None
        if len(encoded) > MAX_ROLE_BYTES:
            # PostgreSQL would cut it to the first 63 bytes and grant to another name.
            raise InvalidArgumentError(
                f"grant_to: role names are at most {MAX_ROLE_BYTES} UTF-8 bytes, got {role!r}"
            )
        if role.lower() == "public":
            raise InvalidArgumentError(
                "grant_to: PUBLIC is every role; grant to the application's role (or, on"
                " purpose, run the GRANT statements of docs/security.md)"
            )
    return tuple(dict.fromkeys(grant_to))  # each role once, in the order given


def migrate(conn: SyncConnectionLike, *, grant_to: Sequence[str] = ()) -> list[int]:
    """Create or upgrade pgsolo's tables; return the versions this call applied.

    ``grant_to``: roles (an application's) to grant, in the same transaction, the least
    privileges every pgsolo feature needs on these tables (docs/security.md); run it
    again with them after each upgrade, so that new tables are granted too."""
    return migrate_to(conn, LATEST_VERSION, grant_to=grant_to)


def migrate_to(
    conn: SyncConnectionLike, version: int, *, grant_to: Sequence[str] = ()
) -> list[int]:
    """:func:`migrate`, up to ``version`` only (a database past it is left as it is):
    Django's migrations of pgsolo's tables (:mod:`pgsolo.django`) bring them to one version
    each, in the transaction of Django's migration when Django opened one."""
    roles = check_roles(grant_to)
    driver = adapt_sync(conn)
    return drive(_migrate_plan(driver, roles, version), driver)


def version_plan(driver: DriverBase, *, first: Sequence[str] = ()) -> Plan[int]:
    """The version of pgsolo's tables in this database (0: never migrated), as a plan:
    :func:`schema_version` drives it, and so does every job attempt that needs the
    tables (``record``, ``period``; ``pgsolo run --record``/``--once-per``).

    One round trip where pgsolo's tables are there (the case that matters, since every
    such job pays it): the version is read directly, and a missing table, which fails
    the statement when it is parsed, means version 0. Inside the caller's transaction the
    read runs in a savepoint, so that the failure costs the transaction nothing.
    ``first``: statements sent before the read in the same message (a job's check that
    the database can hold its name); their failure is raised once the connection is put
    back as it was."""
    status = driver.transaction_status()
    read = [*first, sql.SCHEMA_VERSION]
    if status is TxStatus.INTRANS:
        read = [sql.SAVEPOINT, *read, sql.SAVEPOINT_RELEASE]
    try:
        version = yield outside_transaction(driver, read)
    except Exception as exc:
        if not driver.is_closed():
            if status is TxStatus.INTRANS:
                yield [sql.SAVEPOINT_UNDO, sql.SAVEPOINT_RELEASE]
            elif driver.transaction_status() in (TxStatus.INTRANS, TxStatus.INERROR):
                yield [sql.ROLLBACK]  # the transaction the driver opened for the read
        if sql.meaning(driver.sqlstate(exc)) is not sql.Meaning.NOT_MIGRATED:
            raise
        return 0
    return int(str(version))


def schema_version(conn: SyncConnectionLike) -> int:
    """The version of pgsolo's tables in this database (0: never migrated)."""
    driver = adapt_sync(conn)
    return drive(version_plan(driver), driver)


# Below the definitions above: retention reads nothing of them, and is re-exported here.
from .retention import Pruned, prune  # noqa: E402
