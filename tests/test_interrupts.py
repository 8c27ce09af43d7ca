"""pgsolo._interrupts: a real SIGINT that comes while Ctrl-C is held back reaches the
handler that was there before, once, after the block and never inside it, unless it comes
past the hold's bound; off the main thread the hold does nothing."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType

import pytest

from pgsolo._interrupts import CtrlCHeld, ctrl_c_held


@pytest.fixture(autouse=True)
def _python_handler() -> Iterator[None]:
    """Python's own SIGINT handler for the test, whatever pytest's run had, and back."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _held_block(steps: list[str]) -> None:
    with ctrl_c_held():
        signal.raise_signal(signal.SIGINT)
        steps.append("after the signal")
        steps.append("the block's end")


def test_a_ctrl_c_inside_the_block_is_raised_after_it() -> None:
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        _held_block(steps)
    assert steps == ["after the signal", "the block's end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_handler_before_is_called_once_even_for_two_signals_and_nested_holds() -> None:
    calls: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        calls.append(signum)

    signal.signal(signal.SIGINT, handler)
    with ctrl_c_held():
        with ctrl_c_held():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        assert calls == []  # the outer block still holds it
    assert calls == [signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is handler


def test_without_a_ctrl_c_nothing_is_called_and_the_handler_is_back() -> None:
    with ctrl_c_held():
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_ignored_ctrl_c_stays_ignored() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with ctrl_c_held():
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_off_the_main_thread_the_handler_is_left_alone() -> None:
    seen = []

    def hold() -> None:
        with ctrl_c_held():
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=hold)
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler]


def test_a_ctrl_c_long_after_the_first_held_one_goes_on_at_once() -> None:
    """The bound of a hold that might never end (a clean-up on a connection that stopped
    answering): a Ctrl-C ``give_up_after`` seconds after the first one held back is raised
    at once, and is not raised once more at the release."""
    held = CtrlCHeld(give_up_after=0.2)
    try:
        signal.raise_signal(signal.SIGINT)  # held back
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        held.release()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
