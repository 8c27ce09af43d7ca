"""What a scenario is, what it returns, and the list the suite runs.

A scenario is a function ``run(ctx) -> list[Row]`` registered with :func:`scenario`.
Every :class:`Row` is a RATIO of two costs measured in the same run (pgsolo's ÷ the
other's, so below 1 means pgsolo is cheaper), the median over rounds with the lowest
and highest round (or, for a row of many short rounds, the quartiles), an optional goal
from the issue, and the absolute numbers behind it as text (``detail``) and as data
(``data``, for the JSON file).

A scenario that needs a feature this build may not have passes ``requires=``: a
function that returns ``None`` when the scenario can run, or the reason it cannot,
which the suite prints instead of its rows.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from benchmarks.bench_locks import Target


@dataclass(frozen=True)
class Goal:
    """``ratio <op> value``: e.g. ``Goal("<=", 0.75)``."""

    op: Literal["<=", "<", ">="]
    value: float

    def met(self, ratio: float) -> bool:
        if self.op == "<=":
            return ratio <= self.value
        if self.op == "<":
            return ratio < self.value
        return ratio >= self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:.4g}"


@dataclass(frozen=True)
class Ratio:
    """The median of per-round ratios, with the lowest and the highest (``spread``
    "min-max"), or with the quartiles ("quartiles": a row of many short rounds, whose
    extremes say only how rough the host was at its two worst moments)."""

    median: float
    low: float
    high: float
    spread: Literal["min-max", "quartiles"] = "min-max"

    @classmethod
    def paired(
        cls, ours: Sequence[float], theirs: Sequence[float], *, quartiles: bool = False
    ) -> Ratio:
        """Round by round ``ours[i] / theirs[i]``: both ran in the same round, seconds
        apart, so drift of the machine between rounds cancels out of each ratio."""
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        if quartiles and len(ratios) >= 4:
            q1, median, q3 = statistics.quantiles(ratios, n=4)
            return cls(median, q1, q3, "quartiles")
        return cls(statistics.median(ratios), min(ratios), max(ratios))

    @classmethod
    def of(cls, ratios: Sequence[float]) -> Ratio:
        return cls(statistics.median(ratios), min(ratios), max(ratios))


@dataclass
class Row:
    scenario: str  # the item number, e.g. "1"
    title: str  # what is divided by what, and how it was measured
    ratio: Ratio | None
    goal: Goal | None = None
    detail: str = ""
    problems: list[str] = field(default_factory=list)  # failed checks, e.g. overlaps seen
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``met``, ``MISSED by N%``, ``FAILED: ...`` or empty (no goal)."""
        if self.problems:
            return "FAILED: " + "; ".join(self.problems)
        if self.goal is None or self.ratio is None:
            return ""
        if self.goal.met(self.ratio.median):
            return "met"
        return f"MISSED by {abs(self.ratio.median / self.goal.value - 1) * 100:.0f}%"

    def as_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "title": self.title,
            "ratio": None if self.ratio is None else round(self.ratio.median, 4),
            "ratio_low": None if self.ratio is None else round(self.ratio.low, 4),
            "ratio_high": None if self.ratio is None else round(self.ratio.high, 4),
            "ratio_spread": None if self.ratio is None else self.ratio.spread,
            "goal": None if self.goal is None else str(self.goal),
            "verdict": self.verdict,
            "detail": self.detail,
            "problems": self.problems,
            "data": self.data,
        }


@dataclass(frozen=True)
class Context:
    """What every scenario gets: one server, and how long to measure."""

    target: Target
    server_kind: str
    rounds: int
    quick: bool
    latency_ms: float

    def size(self, full: int, quick: int) -> int:
        return quick if self.quick else full


Runner = Callable[[Context], list[Row]]
Requirement = Callable[[Context], str | None]


@dataclass(frozen=True)
class Scenario:
    number: str
    name: str
    run: Runner
    requires: Requirement | None = None

    def unavailable(self, ctx: Context) -> str | None:
        return None if self.requires is None else self.requires(ctx)


SCENARIOS: list[Scenario] = []


def scenario(
    number: str, name: str, *, requires: Requirement | None = None
) -> Callable[[Runner], Runner]:
    """Register ``run`` as scenario ``number`` (the suite runs them in number order)."""

    def register(run: Runner) -> Runner:
        SCENARIOS.append(Scenario(number, name, run, requires))
        return run

    return register


def quantile(samples: Sequence[float], q: float) -> float:
    """The sample at quantile ``q`` (nearest rank): p99 of 100 samples is the 99th."""
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))])
