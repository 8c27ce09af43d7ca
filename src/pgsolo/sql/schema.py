"""The statements of ``pgsolo migrate`` around the migrations (which are ``.sql`` files
in :mod:`pgsolo.schema`)."""

from __future__ import annotations

from ..errors import InsufficientPrivilegeError
from .states import SQLSTATE_INSUFFICIENT_PRIVILEGE

__all__ = [
    "MIGRATIONS_TABLE",
    "SCHEMA",
    "SCHEMA_OWNER",
    "SCHEMA_VERSION",
    "grants",
    "privilege_error",
    "quote_name",
    "record_migration",
    "require_privileges",
    "table_usable",
]


SCHEMA = "pgsolo"


MIGRATIONS_TABLE = """
CREATE SCHEMA IF NOT EXISTS pgsolo;
CREATE TABLE IF NOT EXISTS pgsolo.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
)"""


SCHEMA_VERSION = "SELECT coalesce(max(version), 0) FROM pgsolo.schema_migrations"

# The role that owns schema pgsolo, if another one does than the current role (or one
# whose privileges it has): only its owner can create and alter pgsolo's tables in it.
SCHEMA_OWNER = (
    "SELECT pg_get_userbyid(nspowner) FROM pg_namespace"
    " WHERE nspname = 'pgsolo' AND NOT pg_has_role(nspowner, 'USAGE')"
)


def record_migration(version: int) -> str:
    return f"INSERT INTO pgsolo.schema_migrations (version) VALUES ({int(version)})"


# What each feature needs on pgsolo's objects besides USAGE on the schema: the least
# privileges, granted by `pgsolo migrate --grant-to` (all of them) and named by the
# InsufficientPrivilegeError of a feature that lacks them. Locks without fencing, the
# keeper and the monitor need nothing here (docs/security.md has the whole table).
FEATURE_PRIVILEGES: dict[str, tuple[tuple[str, str], ...]] = {
    # fencing=True: nextval() in the statement that takes the lock
    "fencing": (("USAGE", "SEQUENCE pgsolo.fencing_token_seq"),),
    # record=True: the version check, the row, and the look back after a busy skip
    "record": (
        ("SELECT", "TABLE pgsolo.schema_migrations"),
        ("SELECT, INSERT", "TABLE pgsolo.job_runs"),
        ("USAGE", "SEQUENCE pgsolo.job_runs_id_seq"),
    ),
    # period=: the version check, "done this period?", and marking it done
    "period": (
        ("SELECT", "TABLE pgsolo.schema_migrations"),
        ("SELECT, INSERT", "TABLE pgsolo.job_periods"),
    ),
    # run_once: read the row, insert or take it over (ON CONFLICT DO UPDATE), finish it
    "once": (("SELECT, INSERT, UPDATE", "TABLE pgsolo.operations"),),
    # pgsolo.history(), pgsolo history
    "history": (("SELECT", "TABLE pgsolo.job_runs"),),
    # leader() on a connection string, campaign(): each term's start, upserted; read by
    # pgsolo doctor and pgsolo locks (without it they show a bound, and leaders lead)
    "leader": (("SELECT, INSERT, UPDATE", "TABLE pgsolo.leader_terms"),),
}


def quote_name(name: str) -> str:
    """``name`` (a role's, a database's) as a quoted identifier in ASCII, whatever it is
    (``U&"..."`` with Unicode escapes unless it is printable ASCII), so that no name can
    end the quotes. Names are checked before (non-empty, no NUL)."""
    if all(" " <= ch <= "~" for ch in name):
        return '"' + name.replace('"', '""') + '"'
    escaped = "".join(
        ch if ch.isascii() and (ch.isalnum() or ch == "_") else _unicode_escape(ch) for ch in name
    )
    return f'U&"{escaped}"'


def _unicode_escape(ch: str) -> str:
    point = ord(ch)
    return f"\\{point:04X}" if point <= 0xFFFF else f"\\+{point:06X}"


def grants(role: str, features: tuple[str, ...] | None = None) -> list[str]:
    """The ``GRANT`` statements that give ``role`` what ``features`` (default: every one)
    need on pgsolo's objects; a privilege two features share is granted once."""
    by_object: dict[str, list[str]] = {}
    for feature in features if features is not None else tuple(FEATURE_PRIVILEGES):
        for privileges, target in FEATURE_PRIVILEGES[feature]:
            held = by_object.setdefault(target, [])
            held += [p for p in privileges.split(", ") if p not in held]
    to = quote_name(role)
    return [f"GRANT USAGE ON SCHEMA {SCHEMA} TO {to}"] + [
        f"GRANT {', '.join(privileges)} ON {target} TO {to}"
        for target, privileges in by_object.items()
    ]


def privilege_error(
    what: str, role: str, *, features: tuple[str, ...] = (), functions: tuple[str, ...] = ()
) -> InsufficientPrivilegeError:
    """The error for ``what`` (a use of pgsolo, for the message), refused by the server for
    lack of a privilege of ``role``: it names the ``GRANT`` statements that fix it, for
    ``features``' privileges on pgsolo's tables and ``EXECUTE`` on ``functions``
    (signatures)."""
    to = quote_name(role)
    needs = tuple(f"GRANT EXECUTE ON FUNCTION {fn} TO {to}" for fn in functions)
    if features:
        needs += tuple(grants(role, features))
    migrate = (
        f" (for pgsolo's tables, `pgsolo migrate --grant-to {role}` grants every feature's,"
        f" or `python manage.py pgsolo_grant {role}` in a Django project, run by the role"
        " that made the tables)"
        if features
        else ""
    )
    return InsufficientPrivilegeError(
        f"{what} needs a privilege that role {role!r} lacks (permission denied, SQLSTATE"
        f" 42501): {'; '.join(needs)}{migrate}",
        needs=needs,
    )


def table_usable(table: str, privileges: tuple[str, ...] = ("SELECT",)) -> str:
    """An expression: whether pgsolo's ``table`` exists and the current role holds every
    one of ``privileges`` on it; false, never an error, otherwise. For what only improves
    with the table: naming it in a statement would fail that statement as it is parsed.
    Schema USAGE first: without it to_regclass itself fails (permission denied for schema
    pgsolo); a NULL oid is no such schema."""
    held = " AND ".join(
        f"has_table_privilege(to_regclass('{table}'), '{privilege}')" for privilege in privileges
    )
    return (
        "CASE WHEN has_schema_privilege((SELECT oid FROM pg_namespace"
        f" WHERE nspname = '{SCHEMA}'), 'USAGE') THEN coalesce({held}, false) ELSE false END"
    )


_HAS_PRIVILEGE = {"TABLE": "has_table_privilege", "SEQUENCE": "has_sequence_privilege"}


def require_privileges(features: tuple[str, ...]) -> str:
    """A statement that fails with SQLSTATE 42501 unless the current role has every
    privilege of ``features`` (with 42P01 or 3F000 when the tables are missing, which
    means not migrated). A job sends it before its lock, so that a role that may check
    the version but not write the ledger learns it before its work runs, not after."""
    tests = [f"has_schema_privilege('{SCHEMA}', 'USAGE')"]
    for feature in features:
        for privileges, target in FEATURE_PRIVILEGES[feature]:
            kind, name = target.split(" ")
            tests += [
                f"{_HAS_PRIVILEGE[kind]}('{name}', '{privilege}')"
                for privilege in privileges.split(", ")
            ]
    return (
        f"DO $pgsolo$BEGIN IF NOT ({' AND '.join(tests)}) THEN RAISE EXCEPTION USING"
        f" ERRCODE = '{SQLSTATE_INSUFFICIENT_PRIVILEGE}',"
        " MESSAGE = 'pgsolo: this role lacks a privilege on pgsolo''s tables'; END IF; END$pgsolo$"
    )
