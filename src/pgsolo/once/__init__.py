"""Operation keys: run a side effect at most once to completion, even across crashes.

A lock stops two workers from running at the same time; it does not stop a retry from
charging a card twice after a crash. For that the article asks for a durable operation
key and an idempotent side effect, and this module gives both halves:

- ``pgsolo.operations`` (migration 3 of ``pgsolo migrate``) holds one row per operation
  key, whose state goes ``started`` -> ``succeeded`` or ``failed``. ``started`` is
  committed before the operation runs, so a crash always leaves a trace.
- Every attempt holds a session advisory lock on its connection while it runs, keyed by
  ``"pgsolo:once:" + op_key`` (key spec v1 name derivation). A caller that finds the lock
  busy knows the holder is alive; one that gets it and finds ``started`` knows the
  holder died (its session, and so its lock, is gone) and takes over.
- The operation gets an idempotency key derived from the operation key alone (see
  :func:`idempotency_key_for`), the same on every attempt and every host, to hand to the
  external service, which then deduplicates what a crash made pgsolo repeat.
- Success and the result are recorded in the transaction in which the operation's own
  database work ran, so both commit or neither does.

A ``failed`` operation is run again by the next call, with the same idempotency key: a
failure can come after the side effect happened (a timeout reading the answer), and the
key is what makes the retry safe.
"""

from __future__ import annotations

from .operation import OnceResult, OperationContext, idempotency_key_for
from .run import run_once, run_once_async

__all__ = ["OnceResult", "OperationContext", "idempotency_key_for", "run_once", "run_once_async"]
