"""A worker process for ``once/test_crash.py``: charge an order once, and stop where told.

Usage: ``python _once_child.py DSN SERVICE_URL ORDER_ID STEP``. It charges the order
through ``pgsolo.run_once`` against the payment service at SERVICE_URL (a real HTTP
server run by the test, which deduplicates by ``Idempotency-Key``), writes the paid order
in the operation's transaction, and prints a JSON line with the outcome. At STEP
(``before-side-effect``, ``after-side-effect``, ``after-record``; ``none`` for no stop)
it prints the step's name and blocks on stdin, where the test kills it with SIGKILL.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

import psycopg

import pgsolo

PAID_ORDERS = "pgsolo_test_paid_orders"
# Straight to the test's server, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def post_charge(service_url: str, order: str, amount: int, idempotency_key: str) -> Any:
    """One request to the payment service, the way a client of a payment API sends it."""
    request = urllib.request.Request(  # noqa: S310 - always http://127.0.0.1:<port>
        f"{service_url}/charges",
        data=json.dumps({"order": order, "amount": amount}).encode(),
        headers={"Idempotency-Key": idempotency_key, "Content-Type": "application/json"},
        method="POST",
    )
    with _OPENER.open(request, timeout=10) as response:
        return json.load(response)


def main() -> None:
    dsn, service_url, order_id, stop_at = sys.argv[1:5]

    def pause(step: str) -> None:
        if step == stop_at:
            print(step, flush=True)
            sys.stdin.readline()  # the test kills this process here

    def charge(ctx: pgsolo.OperationContext[psycopg.Connection[Any]]) -> dict[str, Any]:
        pause("before-side-effect")
        charged = post_charge(service_url, order_id, 1999, ctx.idempotency_key)
        ctx.conn.execute(
            f"INSERT INTO {PAID_ORDERS} (order_id, charge_id) VALUES (%s, %s)",
            (order_id, charged["id"]),
        )
        pause("after-side-effect")
        return {"charge_id": charged["id"], "attempt": ctx.attempt}

    with psycopg.connect(dsn, autocommit=True) as conn:
        result = pgsolo.run_once(conn, f"charge:order:{order_id}", charge)
        pause("after-record")
    print(json.dumps({"outcome": result.outcome, "result": result.result}), flush=True)


if __name__ == "__main__":
    main()
