"""Charge an order once, with the worker killed (SIGKILL) at every step.

The payment service is a real HTTP server in this process, standing in for a remote
payment API: it deduplicates requests by ``Idempotency-Key`` (a repeated key gets the
first answer back) and counts the charges it really executed, per order. Workers are
separate processes (``_once_child.py``) that stop at a named step and tell the test so on
stdout; the test kills them there, so each kill lands exactly at its step. After every
crash a new worker retries the same operation key, and the order must have been charged
exactly once, recorded once, with the result of that one charge.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

import _once_child
import pgsolo
from _once_child import PAID_ORDERS, post_charge
from _support import Connect, eventually
from pgsolo.once.operation import lock_key_for

CHILD = Path(_once_child.__file__).resolve()
DEADLINE = 20.0  # generous: a worker process starts, imports and connects in this time


class PaymentService:
    """A payment API over real HTTP that deduplicates by idempotency key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.replies: dict[str, dict[str, Any]] = {}
        self.requests: Counter[str] = Counter()  # per order: every request that arrived
        self.executions: Counter[str] = Counter()  # per order: charges really made
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                reply = service.charge(
                    body["order"], body["amount"], self.headers["Idempotency-Key"]
                )
                payload = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def charge(self, order: str, amount: int, idempotency_key: str | None) -> dict[str, Any]:
        with self.lock:
            self.requests[order] += 1
            if idempotency_key is not None and idempotency_key in self.replies:
                return self.replies[idempotency_key]
            self.executions[order] += 1
            reply = {"id": f"ch_{uuid.uuid4().hex[:12]}", "order": order, "amount": amount}
            if idempotency_key is not None:
                self.replies[idempotency_key] = reply
            return reply

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(DEADLINE)


@pytest.fixture(scope="module")
def payments() -> Iterator[PaymentService]:
    service = PaymentService()
    yield service
    service.close()


@pytest.fixture(scope="module")
def shop(db: str) -> str:
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {PAID_ORDERS}"
            " (order_id text PRIMARY KEY, charge_id text NOT NULL)"
        )
    return db


class Worker:
    """One worker process, its stdout read line by line with a deadline."""

    def __init__(self, dsn: str, payments: PaymentService, order: str, stop_at: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), dsn, payments.url, order, stop_at],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def next_line(self) -> str:
        try:
            return self.lines.get(timeout=DEADLINE)
        except queue.Empty:
            self.kill()
            pytest.fail(f"worker {self.proc.pid} said nothing within {DEADLINE}s")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(DEADLINE) == -signal.SIGKILL

    def finish(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.next_line())
        assert self.proc.wait(DEADLINE) == 0
        return result


def operation_row(observer: Any, order: str) -> tuple[Any, ...] | None:
    row: tuple[Any, ...] | None = observer.conn.execute(
        "SELECT state, attempts, result, holder_pid FROM pgsolo.operations WHERE op_key = %s",
        (f"charge:order:{order}",),
    ).fetchone()
    return row


def paid(observer: Any, order: str) -> list[str]:
    rows = observer.conn.execute(
        f"SELECT charge_id FROM {PAID_ORDERS} WHERE order_id = %s", (order,)
    ).fetchall()
    return [str(charge_id) for (charge_id,) in rows]


@pytest.mark.parametrize(
    "crashes",
    [
        ["before-side-effect"],
        ["after-side-effect"],
        ["after-record"],
        ["before-side-effect", "after-side-effect", "after-side-effect"],
    ],
    ids=["before-side-effect", "after-side-effect", "after-record", "three-crashes"],
)
def test_an_order_is_charged_exactly_once_whatever_step_the_worker_dies_at(
    shop: str, payments: PaymentService, observer: Any, connect: Connect, crashes: list[str]
) -> None:
    order = uuid.uuid4().hex[:10]
    op_key = f"charge:order:{order}"
    for step in crashes:
        worker = Worker(shop, payments, order, step)
        assert worker.next_line() == step
        state = operation_row(observer, order)
        assert state is not None
        assert state[0] == ("succeeded" if step == "after-record" else "started")
        if step != "after-record":
            # A live holder: anyone else skips, and runs nothing.
            assert observer.holders(lock_key_for(op_key)) == {state[3]}
            called: list[object] = []
            skipped = pgsolo.run_once(connect(), op_key, called.append)
            assert (skipped.outcome, called) == ("skipped-busy", [])
        worker.kill()
        eventually(lambda: not observer.holders(lock_key_for(op_key)), "the lock to go")
        # a worker killed before recording leaves none of its database work behind
        assert len(paid(observer, order)) == (1 if step == "after-record" else 0)

    retry = Worker(shop, payments, order, "none").finish()

    assert payments.executions[order] == 1  # the one assertion that matters
    charges = [reply for reply in payments.replies.values() if reply["order"] == order]
    assert len(charges) == 1
    charge_id = charges[0]["id"]
    assert paid(observer, order) == [charge_id]
    state = operation_row(observer, order)
    assert state is not None
    assert (state[0], state[2]["charge_id"]) == ("succeeded", charge_id)
    if crashes[-1] == "after-record":
        assert retry == {"outcome": "already-succeeded", "result": state[2]}
        assert payments.requests[order] == 1  # nothing ran again
    else:
        assert retry == {"outcome": "ran", "result": state[2]}
        assert state[1] == len(crashes) + 1 == state[2]["attempt"]
        side_effects_reached = sum(step == "after-side-effect" for step in crashes)
        assert payments.requests[order] == side_effects_reached + 1

    called: list[object] = []
    final = pgsolo.run_once(connect(), op_key, called.append)
    assert (final.outcome, final.result, called) == ("already-succeeded", state[2], [])


def test_the_payment_service_would_charge_twice_without_the_same_key(
    payments: PaymentService,
) -> None:
    """The double can see a double charge: what the crash tests rely on."""
    order = uuid.uuid4().hex[:10]
    for key in ("pgsolo-first-attempt", "pgsolo-second-attempt", "pgsolo-second-attempt"):
        assert post_charge(payments.url, order, 1, key)["order"] == order
    assert (payments.requests[order], payments.executions[order]) == (3, 2)
