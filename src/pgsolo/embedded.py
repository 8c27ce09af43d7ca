"""A local PostgreSQL from the ``pgserver`` package, for the demo and the test suite.

Embedded is never chosen silently (DESIGN §5): only ``--dsn embedded``, ``pgsolo demo``
and the test fixture start it. It needs the ``pgsolo[embedded]`` extra.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from .errors import UsageError

__all__ = ["default_data_dir", "embedded_server"]

CleanupMode = Literal["stop", "delete"] | None


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
        import pgserver  # noqa: PLC0415 - an optional extra, imported only when asked for
    except ImportError:
        raise UsageError(
            "the embedded PostgreSQL needs the 'pgserver' package: pip install 'pgsolo[embedded]'"
        ) from None
    path = Path(data_dir) if data_dir is not None else default_data_dir()
    path.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(path, cleanup_mode=cleanup)  # type: ignore[attr-defined]
    try:
        yield server.get_uri()
    finally:
        server.cleanup()  # a no-op when cleanup is None
