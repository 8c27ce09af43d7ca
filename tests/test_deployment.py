"""docs/deployment.md's Kubernetes recipes: each manifest's ``pgsolo`` line runs as written
(its application's program swapped for one that leaves a mark, its outputs sent to the
test's own places), and what the manifest says around it agrees with pgsolo: the exit
codes that end a Job at once are pgsolo's, the CronJob's time zone is the period's."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
import yaml

import pgsolo
from _support import pgsolo_cli, touching
from pgsolo.cli.exit_codes import EXIT_UNSAFE, EXIT_USAGE

PAGE = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
NOWHERE = "http://127.0.0.1:1"  # nothing listens: a push fails at once, with a warning


def manifest(kind: str) -> dict[str, Any]:
    """The page's one ```yaml manifest of ``kind``."""
    blocks = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.DOTALL)
    found = [doc for doc in map(yaml.safe_load, blocks) if doc["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} manifests in {PAGE.name}"
    return dict(found[0])


def container(pod: dict[str, Any]) -> dict[str, Any]:
    """The one container of a pod's ``spec``."""
    (only,) = pod["containers"]
    return dict(only)


def as_run_here(command: list[str], marker: Path, json_file: Path) -> list[str]:
    """The container's ``pgsolo`` arguments, with COMMAND replaced by one that creates
    ``marker`` and the outputs that lead out of the test sent to its own places."""
    assert command[0] == "pgsolo"
    dash = command.index("--")
    args = command[1:dash]
    replaced = {"--json-file": str(json_file), "--pushgateway": NOWHERE}
    for index, arg in enumerate(args[:-1]):
        if arg in replaced:
            args[index + 1] = replaced[arg]
    return [*args, "--", *touching(marker)]


def test_the_cronjob_ends_at_once_only_on_what_a_retry_cannot_fix() -> None:
    cron = manifest("CronJob")
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    (rule,) = job["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"]["containerName"] == container(pod)["name"]
    assert rule["onExitCodes"]["values"] == [EXIT_USAGE, EXIT_UNSAFE]
    assert pod["restartPolicy"] == "Never"  # Kubernetes' condition for a podFailurePolicy
    assert job["backoffLimit"] > 0  # a retry of a done day skips: retries are safe
    assert job["activeDeadlineSeconds"] > 0  # a hung run would hold its key for ever
    command = container(pod)["command"]
    assert cron["spec"]["timeZone"] == command[command.index("--timezone") + 1]


def test_the_cronjobs_command_runs_once_a_day_and_skips_with_0(
    fresh_db: str, tmp_path: Path
) -> None:
    """Guards the recipe's pgsolo line: every flag exists and takes its value, a busy key
    and a day already done both exit 0 (Kubernetes counts any other code as a failed pod),
    and the retry of a done day runs nothing."""
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        pgsolo.migrate(admin)
    pod = manifest("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    command = container(pod)["command"]
    zone = ZoneInfo(command[command.index("--timezone") + 1])
    marker, report = tmp_path / "settled", tmp_path / "termination-log"
    args = as_run_here(command, marker, report)
    env = {"PGSOLO_DSN": fresh_db}  # the container's, from its secret

    def run() -> dict[str, Any]:
        done = pgsolo_cli(*args, env=env)
        assert done.returncode == 0, done.stderr
        assert "metrics not published" in done.stderr  # pushed, to nowhere: a warning only
        outcome: dict[str, Any] = json.loads(report.read_text(encoding="utf-8"))
        return outcome

    key = command[command.index("--key") + 1]
    with (
        psycopg.connect(fresh_db, autocommit=True) as other,
        pgsolo.session_lock(other, key),
    ):
        busy = run()
    assert (busy["outcome"], busy["reason"]) == ("skipped", "busy")
    assert not marker.exists()

    day = datetime.now(zone).date()
    ran = run()
    assert (ran["outcome"], ran["exit_code"]) == ("completed", 0)
    assert marker.exists()
    marker.unlink()
    again = run()
    if datetime.now(zone).date() != day:
        pytest.skip("the day changed in the recipe's time zone between the two runs")
    assert (again["outcome"], again["reason"]) == ("skipped", "already-done-this-period")
    assert not marker.exists()


def test_the_deployments_command_runs_as_the_leader(fresh_db: str, tmp_path: Path) -> None:
    with psycopg.connect(fresh_db, autocommit=True) as admin:
        pgsolo.migrate(admin)
    pod = manifest("Deployment")["spec"]["template"]["spec"]
    marker = tmp_path / "scheduled"
    args = as_run_here(container(pod)["command"], marker, tmp_path / "unused")
    done = pgsolo_cli(*args, env={"PGSOLO_DSN": fresh_db})
    assert done.returncode == 0, done.stderr
    assert marker.exists()
