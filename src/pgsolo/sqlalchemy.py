"""pgsolo with SQLAlchemy: every lock API takes a ``Connection``, ``AsyncConnection``,
``orm.Session`` or ``AsyncSession`` directly; this module has the one thing that needs the
engine, the pool hook :func:`install`.

Importing it does not import SQLAlchemy: :func:`install` does, when called.
"""

from __future__ import annotations

from .locking import install

__all__ = ["install"]
