"""What an operation key is and what a call returns: validation, the idempotency key,
the storable result (key spec in DESIGN §2)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .._types import OnceOutcome
from ..errors import (
    InvalidOperationKeyError,
    ResultNotStorableError,
)
from ..keys import ONCE_PREFIX, Key, checked_text, from_name

__all__ = [
    "MAX_OP_KEY_BYTES",
    "MAX_RESULT_BYTES",
    "OnceResult",
    "OperationContext",
    "idempotency_key_for",
    "lock_key_for",
    "storable_result",
    "validate_op_key",
]

MAX_OP_KEY_BYTES = 512


MAX_RESULT_BYTES = 1024 * 1024  # of compact UTF-8 JSON


IDEMPOTENCY_PREFIX = "pgsolo-"


# Versioned, so that a future derivation can never hand out a key of this one.
_IDEMPOTENCY_DOMAIN = b"pgsolo idempotency key v1\0"


if TYPE_CHECKING:
    # PEP 696: a bare ``OperationContext`` is ``OperationContext[Any]`` (mypy --strict
    # accepts it). typing.TypeVar takes ``default=`` only from Python 3.13; type checkers
    # always know typing_extensions, so no runtime dependency is needed for an annotation.
    from typing_extensions import TypeVar as DefaultTypeVar

    C = DefaultTypeVar("C", default=Any)
else:
    C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class OnceResult:
    """What one call of :func:`run_once` found or did."""

    outcome: OnceOutcome
    """``ran``: this call ran the operation to success. ``already-succeeded``: an earlier
    attempt did, nothing ran. ``skipped-busy``: another caller is running it right now
    (and did not finish within ``wait``); nothing ran and nothing is known to succeed."""
    op_key: str
    idempotency_key: str
    result: Any = None
    """The stored result (the operation's return value as it reads back from JSON)."""
    attempts: int = 0
    """Attempts recorded for this operation so far (0: none known)."""

    @property
    def succeeded(self) -> bool:
        """True when the operation has succeeded (by this call or an earlier one)."""
        return self.outcome != "skipped-busy"


@dataclass(frozen=True, slots=True)
class OperationContext(Generic[C]):
    """What the operation is given: who it is, and the connection to do its work on.

    Statements run on ``conn`` belong to the transaction in which success and the result
    are recorded: they commit with them, or not at all.
    """

    op_key: str
    idempotency_key: str
    """Pass this to the external service (an ``Idempotency-Key`` header, a request id)."""
    attempt: int
    """1 for the first attempt; more when an earlier one failed or died."""
    conn: C


def validate_op_key(op_key: object) -> str:
    """``op_key`` if it is a valid operation key, else :class:`InvalidOperationKeyError`."""
    return checked_text(op_key, "an operation key", MAX_OP_KEY_BYTES, InvalidOperationKeyError)


def idempotency_key_for(op_key: str) -> str:
    """The idempotency key of ``op_key``: ``"pgsolo-"`` + the 64 hex digits of
    SHA-256(``b"pgsolo idempotency key v1\\0"`` + UTF-8 of ``op_key``).

    71 characters of ``[a-z0-9-]``, accepted by payment and storage APIs (Stripe allows
    255), the same on every host and in every version, and revealing nothing of the key.
    """
    digest = hashlib.sha256(_IDEMPOTENCY_DOMAIN + validate_op_key(op_key).encode("utf-8"))
    return IDEMPOTENCY_PREFIX + digest.hexdigest()


def lock_key_for(op_key: str) -> Key:
    """The advisory-lock key that a live attempt at ``op_key`` holds."""
    return from_name(ONCE_PREFIX + validate_op_key(op_key))


def storable_result(value: object) -> str:
    """``value`` as the compact JSON text that is stored, or :class:`ResultNotStorableError`.

    PostgreSQL's ``jsonb`` refuses what JSON cannot say (NaN, infinity) and text with a
    NUL or an unpaired surrogate, so those are refused here, before anything is recorded.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise ResultNotStorableError(
            f"the operation's result is not JSON-serialisable ({type(value).__name__}): {exc}"
        ) from None
    _check_text(json.loads(text))
    size = len(text.encode("utf-8"))
    if size > MAX_RESULT_BYTES:
        raise ResultNotStorableError(
            f"the operation's result is {size} bytes of JSON; at most {MAX_RESULT_BYTES}"
            " can be stored (store a reference to large data, not the data)"
        )
    return text


def _check_text(value: object) -> None:
    items: list[object] = []
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, list):
        items = value
    elif isinstance(value, str):
        if "\0" in value:
            raise ResultNotStorableError("the operation's result contains a NUL character")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ResultNotStorableError(
                f"the operation's result contains text that is not valid Unicode: {exc}"
            ) from None
    for item in items:
        _check_text(item)
