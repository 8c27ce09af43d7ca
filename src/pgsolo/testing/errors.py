"""What the helpers of :mod:`pgsolo.testing` raise when they cannot give what was asked.

Neither is a :class:`~pgsolo.PgsoloError`: they are about the test machine, not about a
lock. The pytest fixtures turn :class:`Unavailable` into a skip that says what to install,
and let :class:`SetupError` fail the test.
"""

from __future__ import annotations

__all__ = ["SetupError", "Unavailable"]


class Unavailable(Exception):
    """A program the helper needs is not on this machine (PgBouncer, PostgreSQL's server
    binaries), and nothing said where to find one."""


class SetupError(Exception):
    """The helper was told where to find what it needs (an environment variable), or found
    it, and it did not work: a server or a PgBouncer that did not start, a standby that does
    not stream."""
