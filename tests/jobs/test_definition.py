"""``Job.define``: a job's options, checked before anything connects, and the definitions
it keeps so that a job run again and again is not checked again (``_DEFINED``)."""

from __future__ import annotations

from typing import Any

import pytest

from pgsolo import InvalidArgumentError, InvalidKeyError, Key, Registry, UsageError
from pgsolo.jobs import definition
from pgsolo.jobs.definition import Job

# What a kept definition equals (==, and so the same dict key) but is refused: each
# first defined as the good one, then as the bad one.
_EQUAL_BUT_REFUSED: list[tuple[Any, dict[str, Any], Any, dict[str, Any], type[Exception]]] = [
    ((7301, 1), {}, (7301, True), {}, InvalidKeyError),
    (7302, {}, True, {}, InvalidKeyError),
    (7303, {"wait": 1}, 7303, {"wait": True}, InvalidArgumentError),
    (7304, {"record": True}, 7304, {"record": 1}, UsageError),
    (7305, {"raise_errors": False}, 7305, {"raise_errors": 0}, UsageError),
    (
        7306,
        {"lifetime": "xact", "wait": 2.0},
        7306.0,
        {"lifetime": "xact", "wait": 2.0},
        InvalidKeyError,
    ),
]


@pytest.mark.parametrize(
    ("good", "good_options", "bad", "bad_options", "error"), _EQUAL_BUT_REFUSED
)
def test_a_kept_definition_never_lets_an_equal_bad_one_through(
    good: Any,
    good_options: dict[str, Any],
    bad: Any,
    bad_options: dict[str, Any],
    error: type[Exception],
) -> None:
    """Guards the kept definitions: ``True == 1`` and ``1 == 1.0`` in Python, and a key or
    an option refused for its type must be refused after an equal good one was kept."""
    kept = Job.define(good, **good_options)
    assert Job.define(good, **good_options) is kept
    for _ in range(2):
        with pytest.raises(error):
            Job.define(bad, **bad_options)


def test_a_key_s_name_names_its_job_though_keys_of_other_names_are_equal() -> None:
    """Guards the kept definitions of a Key, whose name plays no part in its equality:
    the job of each is named after its own."""
    first, second = Key(7307, name="definition-first"), Key(7307, name="definition-second")
    assert first == second
    assert Job.define(first).name == "definition-first"
    assert Job.define(second).name == "definition-second"
    assert Job.define(Key(7307)).name == "7307"


def test_a_definition_is_kept_only_once_it_passed_every_check() -> None:
    """A NaN wait (which equals nothing) is refused every time; an unknown option too,
    after the same job was defined without it."""
    Job.define(7310, name="definition-kept")
    for _ in range(2):
        with pytest.raises(InvalidArgumentError):
            Job.define(7310, name="definition-kept", wait=float("nan"))
        with pytest.raises(UsageError, match="did you mean wait= for wiat="):
            Job.define(7310, name="definition-kept", wiat=5)  # type: ignore[call-arg]


def test_a_registry_s_definitions_are_not_kept() -> None:
    """Guards a name's key through a Registry, which the caller can change: a name
    registered after a job of it was defined is that job's key from then on."""
    registry = Registry()
    derived = Job.define("definition-registered", registry=registry).key
    registry.register("definition-registered", 7320)
    assert (
        Job.define("definition-registered", registry=registry).key.text == "7320" != (derived.text)
    )


def test_the_kept_definitions_are_bounded() -> None:
    """Jobs whose names come from data (a job per tenant) keep at most a few hundred."""
    for tenant in range(3 * definition._DEFINED_AT_MOST):
        job = Job.define(7330, name=f"definition-tenant-{tenant}")
        assert job.name == f"definition-tenant-{tenant}"
        assert len(definition._DEFINED) <= definition._DEFINED_AT_MOST
