"""Items 1 and 2: one uncontended try-lock around a no-op, pgsolo against the article's
recipe on the same driver and against the peers, measured by ``bench_locks.py``.

Both run twice: through the loopback proxy that delays every server reply (round trips
dominate, as across any network) and directly over the server's socket (the client's
CPU per operation dominates). The rows divide pgsolo's time per operation by the
other's, paired by round.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks import bench_locks
from benchmarks.registry import Context, Goal, Ratio, Row, scenario

XACT_GOAL = Goal("<=", 0.75)  # pgsolo saves one of the recipe's three round trips
SESSION_GOAL = Goal("<=", 1.05)  # the same two round trips: pgsolo must cost ~nothing more
PALS_GOAL = Goal("<=", 1 / 3)  # at least 3x faster than pals
DRIVER_GOAL = Goal("<=", 1.05)  # on every library: no dearer than the recipe by hand on it
# Over the local socket the client's CPU shows (the performance issue's goals): pgsolo's
# own Python must be all but free next to the driver's, and an event loop's turn dearer.
DIRECT_SESSION = Goal("<=", 1.05)
DIRECT_SESSION_ASYNC = Goal("<=", 1.10)
DIRECT_XACT = Goal("<=", 0.75)
DIRECT_XACT_ASYNC = Goal("<=", 0.80)
DIRECT_ASYNCPG_SESSION = Goal("<=", 1.10)
LIBRARIES = ("psycopg2", "asyncpg", "sqlalchemy", "django")

# (pgsolo contender, other contender, goal through the latency proxy, goal over the
# local socket, which item); the other may be a peer.
PAIRS: list[tuple[str, str, Goal | None, Goal | None, str]] = [
    ("pgsolo-xact", "recipe-xact", XACT_GOAL, DIRECT_XACT, "1"),
    ("pgsolo-xact-async", "recipe-xact-async", XACT_GOAL, DIRECT_XACT_ASYNC, "1"),
    ("pgsolo-xact/autocommit-off", "recipe-xact", None, None, "1"),
    # What refusing a standby costs: the recipe with pgsolo's check, over the recipe.
    ("recipe-xact+standby-check", "recipe-xact", None, None, "1"),
    ("pgsolo-session", "recipe-session", SESSION_GOAL, DIRECT_SESSION, "2"),
    ("pgsolo-session-async", "recipe-session-async", SESSION_GOAL, DIRECT_SESSION_ASYNC, "2"),
    ("pgsolo-session", "pals", PALS_GOAL, PALS_GOAL, "2"),
    ("pgsolo-session", "tooz", None, None, "2"),
    ("pgsolo-session-async", "asyncpg-lock", None, None, "2"),
    # The connections users already have: pgsolo on each, over the recipe by hand on it.
    *(
        (
            f"pgsolo-{lifetime}-{library}",
            f"recipe-{lifetime}-{library}",
            DRIVER_GOAL,
            DIRECT_ASYNCPG_SESSION if (library, lifetime) == ("asyncpg", "session") else None,
            "drivers",
        )
        for library in LIBRARIES
        for lifetime in ("xact", "session")
    ),
]


# Over the local socket a round of some 25 contenders takes seconds, and the host's speed
# moves within them: the two sides of a ratio, a second apart, differed by up to 1.5x in a
# round. So there the rounds are many and short, and the sides of each pair with a goal
# run next to each other (a round runs the contenders in this order, the next reversed).
DIRECT_ROUNDS_PER_ROUND = 8  # 40 rounds where the suite's other rows take 5
DIRECT_OPS = 100


def _adjacent_order() -> list[str]:
    """Every contender of :data:`PAIRS`, each pgsolo contender with a direct-socket goal
    between the (at most two) others it is divided by there."""
    partners: dict[str, list[str]] = {}
    for ours, theirs, _, direct_goal, _ in PAIRS:
        if direct_goal is not None:
            partners.setdefault(ours, []).append(theirs)
    order: list[str] = []
    for ours, others in partners.items():
        assert len(others) <= 2, f"{ours} has a side for two others only"
        order += [others[0], ours, *others[1:]]
    return list(dict.fromkeys(order + [name for pair in PAIRS for name in pair[:2]]))


def _measure(ctx: Context, latency_ms: float | None) -> dict[str, dict[str, Any]]:
    if latency_ms is None:
        iterations = ctx.size(DIRECT_OPS, 20)
        rounds = ctx.rounds * DIRECT_ROUNDS_PER_ROUND
    else:
        iterations = ctx.size(bench_locks.DEFAULT_LATENCY_ITERATIONS, 3)
        rounds = ctx.rounds
    args = argparse.Namespace(dsn=None, latency_ms=latency_ms, iterations=iterations, rounds=rounds)
    result = bench_locks.run_on(ctx.target, ctx.server_kind, args, only=_adjacent_order())
    return {r["contender"]: r for r in result["results"]}


def _fmt_us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def _rows(measured: dict[str, dict[str, Any]], mode: str, *, direct: bool) -> list[Row]:
    rows = []
    for ours, theirs, proxied_goal, direct_goal, item in PAIRS:
        a, b = measured.get(ours), measured.get(theirs)
        if a is None or b is None:
            continue  # a peer that is not installed (the suite printed why)
        rt = f"{a['round_trips_per_op']:g} vs {b['round_trips_per_op']:g} round trips; "
        rows.append(
            Row(
                scenario=item,
                title=f"{ours} ÷ {theirs}, {mode}",
                ratio=Ratio.paired(a["round_medians_us"], b["round_medians_us"], quartiles=direct),
                goal=direct_goal if direct else proxied_goal,
                detail=rt + f"{_fmt_us(a['median_us'])} vs {_fmt_us(b['median_us'])} per op",
                data={"ours": a, "theirs": b},
            )
        )
    return rows


@scenario("1-2", "uncontended try-lock around a no-op: recipe and peers")
def uncontended(ctx: Context) -> list[Row]:
    proxied = _measure(ctx, ctx.latency_ms)
    direct = _measure(ctx, None)
    return [
        *_rows(proxied, f"{ctx.latency_ms:g} ms per round trip", direct=False),
        *_rows(direct, "direct socket", direct=True),
    ]
