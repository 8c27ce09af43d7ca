"""pgsolo.testing: test your own jobs and locks against a real PostgreSQL.

Install ``pgsolo[testing]`` and pytest finds the fixtures of :mod:`pgsolo.testing.plugin`
(``pgsolo_dsn``, ``pgsolo_relay``, ``pgsolo_bouncer``, ...); nothing starts until a test
asks for one. The helpers below work without pytest too (pgsolo's chaos suite and
benchmarks use them): another session that holds a key (:func:`hold_elsewhere`), an
operator who terminates its holder (:func:`lose`, :func:`losing`), a relay that cuts the
network (:class:`Relay`), a real PgBouncer (:func:`running_bouncer`), a private primary and
standby (:func:`replica_pair`) and a throwaway server to restart and pause
(:func:`throwaway_server`). docs/testing.md shows each in a test.

It sits beside pgsolo's layers: it uses the library through its public API (and the
drivers' doors to psycopg: connections, connection strings), and nothing in the library
imports it (import-linter says so).

Every pytest run of whoever installed the extra loads the plugin, and with it this package:
so the helpers, psycopg and the library under them are imported on first use (PEP 562),
and loading costs next to nothing.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .errors import SetupError, Unavailable

if TYPE_CHECKING:  # the same names as _ON_FIRST_USE, for type checkers
    from .bouncer import POOL_SIZE, Bouncer, PoolMode, bouncer_client, running_bouncer
    from .cluster import ReplicaPair, Replicas, replica_pair, server_binaries
    from .locks import hold_elsewhere, lose, losing
    from .relay import Relay
    from .server import Server, throwaway_server

__all__ = [
    "POOL_SIZE",
    "Bouncer",
    "PoolMode",
    "Relay",
    "ReplicaPair",
    "Replicas",
    "Server",
    "SetupError",
    "Unavailable",
    "bouncer_client",
    "hold_elsewhere",
    "lose",
    "losing",
    "replica_pair",
    "running_bouncer",
    "server_binaries",
    "throwaway_server",
]

# Where each name that is imported on first use lives (tests/testing/test_plugin.py checks
# that this, the imports above and __all__ agree).
_ON_FIRST_USE = {
    **dict.fromkeys(
        ("POOL_SIZE", "Bouncer", "PoolMode", "bouncer_client", "running_bouncer"), ".bouncer"
    ),
    **dict.fromkeys(("ReplicaPair", "Replicas", "replica_pair", "server_binaries"), ".cluster"),
    **dict.fromkeys(("hold_elsewhere", "lose", "losing"), ".locks"),
    "Relay": ".relay",
    **dict.fromkeys(("Server", "throwaway_server"), ".server"),
}


def __getattr__(name: str) -> object:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value  # once: the next access does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
