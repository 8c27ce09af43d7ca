"""The ratios of one suite run as a PNG: one line per row, the median round as a dot,
the lowest and highest round as a bar, the goal as a tick. Needs matplotlib."""

from __future__ import annotations

import textwrap
from pathlib import Path

from benchmarks.registry import Row

COLOURS = {"met": "tab:green", "missed": "tab:red", "none": "tab:blue"}


def _colour(row: Row) -> str:
    if row.problems:
        return COLOURS["missed"]
    if row.goal is None:
        return COLOURS["none"]
    return COLOURS["met"] if row.verdict == "met" else COLOURS["missed"]


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib  # noqa: PLC0415 - optional: the bench extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    shown = [r for r in rows if r.ratio is not None]
    fig, ax = plt.subplots(figsize=(11, 0.42 * len(shown) + 1.6))
    for y, row in enumerate(reversed(shown)):
        assert row.ratio is not None
        ratio = row.ratio
        ax.errorbar(
            ratio.median,
            y,
            xerr=[[ratio.median - ratio.low], [ratio.high - ratio.median]],
            fmt="o",
            color=_colour(row),
            capsize=3,
        )
        if row.goal is not None:
            ax.plot(row.goal.value, y, marker="|", markersize=14, color="black")
    labels = [
        textwrap.shorten(f"{r.scenario}  {r.title}", 80, placeholder="...") for r in reversed(shown)
    ]
    ax.set_yticks(range(len(shown)), labels, fontsize=8)
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("pgsolo's cost ÷ the other's (log scale; below 1: pgsolo is cheaper)")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", which="both", alpha=0.3)
    ax.plot([], [], "o", color=COLOURS["met"], label="goal met")
    ax.plot([], [], "o", color=COLOURS["missed"], label="goal missed")
    ax.plot([], [], "o", color=COLOURS["none"], label="no goal")
    ax.plot([], [], "|", markersize=14, color="black", label="goal")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
