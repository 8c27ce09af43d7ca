"""Every SQL statement pgsolo sends, in one place.

Statements are plain ASCII text with no bind parameters so that several of them can
travel in one simple-query message (one round trip); a lock call alone may also be
prepared once per session, with the key as its parameters
(:class:`~pgsolo.sql.locks.LockCall`). Splicing is safe because the only values spliced
in are Python ints validated by :class:`~pgsolo.keys.Key`, millisecond counts that are
ints by construction, period units from a fixed list, and text (job names, hosts, error
messages) written as hex digits by :func:`~pgsolo.sql.text.sql_text`, which no session
setting or client encoding can turn into a quote.

What comes back is independent of the client encoding too. The lock statements answer
with booleans and integers only. Every text or JSON answer (the proxy check's stamp, an
operation's row and result, the ledger, the monitor's snapshots, which carry other
sessions' queries) is sent as its UTF-8 bytes in a ``bytea`` (:func:`utf8`) and decoded in
Python (:func:`read_text`, :func:`read_json`): under ``SQL_ASCII`` psycopg would return
text as ``bytes``, under ``LATIN1`` the server would refuse a character that encoding
lacks, and psycopg reads JSON as UTF-8 whatever the encoding.

Each subject module lists its own names in its ``__all__``; this package re-exports them
all (``sql.ROLLBACK``, ``sql.acquire``), so a statement is named where it is written and
nowhere else.
"""

from __future__ import annotations

from . import leaders, ledger, locks, monitor, once, retention, schema, states, text
from .leaders import *  # noqa: F403
from .ledger import *  # noqa: F403
from .locks import *  # noqa: F403
from .monitor import *  # noqa: F403
from .once import *  # noqa: F403
from .retention import *  # noqa: F403
from .schema import *  # noqa: F403
from .states import *  # noqa: F403
from .text import *  # noqa: F403

__all__ = (
    leaders.__all__
    + ledger.__all__
    + locks.__all__
    + monitor.__all__
    + once.__all__
    + retention.__all__
    + schema.__all__
    + states.__all__
    + text.__all__
)
