"""pgsolo.testing: test your own jobs and locks against a real PostgreSQL.

Install ``pgsolo[testing]`` and pytest finds the fixtures of :mod:`pgsolo.testing.plugin`
(``pgsolo_dsn``, ``pgsolo_relay``, ``pgsolo_bouncer``, ...); nothing starts until a test
asks for one. The helpers below work without pytest too (pgsolo's chaos suite and
benchmarks use them): another session that holds a key (:func:`hold_elsewhere`), an
operator who terminates its holder (:func:`lose`, :func:`losing`), a relay that cuts the
network (:class:`Relay`), a real PgBouncer (:func:`running_bouncer`), a private primary and
standby (:func:`replica_pair`) and a throwaway server to restart and pause
(:func:`throwaway_server`). docs/testing.md shows each in a test.

It sits beside pgsolo's layers: it uses the library through its public API, and nothing in
the library imports it (import-linter says so).
"""

from __future__ import annotations

from .bouncer import POOL_SIZE, Bouncer, PoolMode, bouncer_client, running_bouncer
from .cluster import ReplicaPair, Replicas, replica_pair, server_binaries
from .errors import SetupError, Unavailable
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
