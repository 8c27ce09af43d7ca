"""A round trip awaited in the caller's own task, out of reach of the caller's cancellation.

``asyncio.shield(asyncio.ensure_future(step))`` keeps a cancellation of the caller from
reaching the step by running the step in a task of its own, and that costs the event
loop three turns more per round trip: one to start the task, one for the ended task to
hand its result to the shield, one for the shield to wake the caller. Over a local
socket those turns cost an asyncpg transaction lock more than its own Python did, and
they come between the server's answer and the next message, when the server's core may
have gone idle.

:func:`awaited_in_place` runs the step in the caller's task instead, as a plain ``await``
would, with one difference: the caller's task does not wait on the step's own future
(asyncpg's waiter, whose cancellation makes asyncpg hand the cancellation on before the
server answered) but on a stand-in that the step's future wakes. A cancellation of the
caller cancels the stand-in only; from there the step goes on in a task of its own,
which ``on_cancel`` gets as it would have got the shielded task, to bring the round trip
to its end before the cancellation goes on. One turn more per round trip than a plain
``await``, instead of three.
"""

from __future__ import annotations

import asyncio
import functools
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any, TypeVar

__all__ = ["awaited_in_place"]

T = TypeVar("T")


@types.coroutine
def awaited_in_place(
    step: Coroutine[Any, Any, T],
    on_cancel: Callable[[asyncio.Future[T]], Awaitable[None]],
) -> Generator[Any, None, T]:
    """``await step``, in this task; if this task is cancelled meanwhile, the step goes on
    in a task of its own, ``on_cancel(that task)`` is awaited, and the cancellation goes
    on."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            waited = step.send(None)
        except StopIteration as end:
            return end.value  # type: ignore[no-any-return]
        stand_in: asyncio.Future[None] | None = None
        if waited is not None:  # a future, as a task would get it (else a bare yield)
            waited._asyncio_future_blocking = False
            stand_in = loop.create_future()
            wake = functools.partial(_wake, stand_in)
            waited.add_done_callback(wake)
        try:
            if stand_in is None:
                yield None
            else:
                yield from stand_in
        except asyncio.CancelledError:
            if waited is not None:
                waited.remove_done_callback(wake)
            go_on = _go_on(step, waited)
            go_on.send(None)  # primed: see _go_on
            block: asyncio.Future[T] = asyncio.ensure_future(go_on)
            yield from on_cancel(block).__await__()
            raise
        except GeneratorExit:
            step.close()
            raise


def _wake(stand_in: asyncio.Future[None], _: object) -> None:
    if not stand_in.done():  # not cancelled meanwhile
        stand_in.set_result(None)


@types.coroutine
def _go_on(step: Coroutine[Any, Any, T], waited: Any) -> Generator[Any, Any, T]:
    """The rest of ``step``, which waits on ``waited`` (a future, or None after a bare
    yield), driven as its own task would drive it: a cancellation of this task reaches
    ``waited``. Primed by the hand-over up to its first ``yield``, so that a cancellation
    of the task before its first turn lands there, and not, with nothing run, on a
    generator that would end at once and leave the step suspended for good."""
    value: Any = None
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:  # cancelled before the first turn
        if waited is None or not waited.cancel():  # else the step gets it from waited
            error, waited = exc, None
    while True:
        if waited is not None:
            waited._asyncio_future_blocking = True  # as the future's own __await__ sets it
            pending, waited = waited, None
        else:
            try:
                pending = step.send(value) if error is None else step.throw(error)
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]
        try:
            value, error = (yield pending), None
        except BaseException as exc:  # into the step, as its own task would throw it
            value, error = None, exc
