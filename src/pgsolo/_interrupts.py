"""A Ctrl-C held back over a few steps that must not be cut in two.

Python raises ``KeyboardInterrupt`` between any two bytecodes of the main thread, and some
steps pgsolo takes once per process have no way back if cut there: prometheus_client's
``CollectorRegistry.register`` records a metric's names one by one, and a registry left
holding half of them refuses the whole metric, as a duplicate, for the life of the
process; and pg8000 can neither cancel a round trip nor be cut off in the middle of
one. Those steps run under :func:`ctrl_c_held`, and the Ctrl-C comes as they end (the
registration's microseconds, an import's milliseconds, a pg8000 round trip's time), where
pgsolo's own ``finally`` clauses expect it.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType

__all__ = ["ctrl_c_held"]


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Run the block with SIGINT's handler held back; once the block is over, hand a
    SIGINT that came meanwhile to the handler that was there before, as it would have been
    handed (``KeyboardInterrupt``, asyncio's cancellation of its main task, the
    application's own handler...). Only the main thread runs Python's signal handlers:
    elsewhere, and where SIGINT is ignored, ends the process at once or has a handler not
    set from Python, no Python code of the block can be cut, and there is nothing to
    hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    if not callable(before):  # ignored, or the default action, or not Python's: no code runs
        yield
        return
    came: list[FrameType | None] = []
    signal.signal(signal.SIGINT, lambda _signum, frame: came.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if came:
            before(signal.SIGINT, came[0])
