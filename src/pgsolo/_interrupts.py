"""A Ctrl-C held back over a few steps that must not be cut in two.

Python raises ``KeyboardInterrupt`` between any two bytecodes of the main thread, and some
steps pgsolo takes once per process have no way back if cut there: prometheus_client's
``CollectorRegistry.register`` records a metric's names one by one, and a registry left
holding half of them refuses the whole metric, as a duplicate, for the life of the
process. Those steps run under :func:`ctrl_c_held`; they take microseconds, or an import's
few milliseconds, so the Ctrl-C comes that much later and lands where pgsolo's own
``finally`` clauses expect it.
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
    elsewhere, and where the handler was not set from Python, there is nothing to hold."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    if before is None:
        yield
        return
    came: list[FrameType | None] = []
    signal.signal(signal.SIGINT, lambda _signum, frame: came.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if came:
            if callable(before):
                before(signal.SIGINT, came[0])
            elif before == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)
