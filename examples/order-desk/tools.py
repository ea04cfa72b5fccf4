"""Order look-ups for the order-desk example (a fixed table: no network)."""

import json
import time

ORDERS = {
    "A-1001": {"status": "shipped", "carrier": "PostNord"},
    "A-1002": {"status": "processing"},
}


def lookup_order(order_id: str) -> str:
    """Look an order up by its id.

    Args:
        order_id: The order id, e.g. A-1001.
    """
    order = ORDERS.get(order_id)
    if order is None:
        return json.dumps({"status": "unknown", "order_id": order_id})
    return json.dumps({"order_id": order_id, **order})


def check_payment(order_id: str) -> str:
    """Whether the order was paid.

    Args:
        order_id: The order id.
    """
    return json.dumps({"paid": order_id in ORDERS})


def check_carrier(order_id: str) -> str:
    """Where the carrier says the parcel is.

    Args:
        order_id: The order id.
    """
    time.sleep(0.2)
    carrier = ORDERS.get(order_id, {}).get("carrier")
    return json.dumps({"delivered": carrier is not None})


def check_history(order_id: str) -> str:
    """Earlier refunds of the customer (a slow archive).

    Args:
        order_id: The order id.
    """
    time.sleep(20)
    return json.dumps({"past_refunds": 0})
