"""Order look-ups for the order-desk example (a fixed table: no network)."""

import json

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
