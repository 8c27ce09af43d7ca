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

import signal
import threading
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

__all__ = ["CtrlCHeld", "ctrl_c_held"]


class CtrlCHeld:
    """SIGINT's handler held back from now until :meth:`release`; then a SIGINT that came
    meanwhile goes to the handler that was there before, as it would have gone
    (``KeyboardInterrupt``, asyncio's cancellation of its main task, the application's own
    handler...). ``give_up_after``: seconds after the first one held back, a further
    SIGINT goes on at once, so that a step that hangs (a connection that stopped
    answering) cannot keep the process from being interrupted for good.

    Only the main thread runs Python's signal handlers: elsewhere, and where SIGINT is
    ignored, ends the process at once or has a handler not set from Python, no Python code
    can be cut, and there is nothing to hold."""

    def __init__(self, give_up_after: float | None = None) -> None:
        self._give_up_after = give_up_after
        self._came: list[FrameType | None] = []
        self._first = 0.0
        self._before: Callable[[int, FrameType | None], object] | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        before = signal.getsignal(signal.SIGINT)
        if callable(before):
            self._before = before
            signal.signal(signal.SIGINT, self._hold)

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if not self._came:
            self._first = now
        elif self._give_up_after is not None and now - self._first > self._give_up_after:
            self._came.clear()  # handed on now, not once more at the release
            if self._before is not None:
                self._before(signum, frame)
            return
        self._came.append(frame)

    def __enter__(self) -> CtrlCHeld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        before, self._before = self._before, None
        if before is None:
            return
        signal.signal(signal.SIGINT, before)
        if self._came:
            before(signal.SIGINT, self._came[0])


# ``with ctrl_c_held():`` runs the block with SIGINT's handler held back; a SIGINT that came
# meanwhile is handed on once the block is over. The class itself: a call less per use.
ctrl_c_held = CtrlCHeld
