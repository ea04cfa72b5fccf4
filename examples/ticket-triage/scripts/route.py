#!/usr/bin/env python3
"""Route a classified ticket: the team, the response target and the team's playbook.

Reads the graph state (GRAPH_STATE or GRAPH_STATE_FILE) and prints one JSON
object; ``_next`` sends tickets that are not support requests to a person.
"""

import json
import os

TEAMS = {
    "billing": (
        "Billing",
        "- Confirm the charges or invoices the customer mentions.\n"
        "- A duplicate charge in the same billing period is refunded on request: say the\n"
        "  refund goes back to the original payment method within 5-10 business days.\n"
        "- Never ask for card numbers. Plan changes take effect at the next billing date.",
    ),
    "technical": (
        "Platform Support",
        "- Acknowledge the impact and say an engineer is looking at it now.\n"
        "- Ask for the project name, the time the problem started and a request id\n"
        "  if they are not in the ticket.\n"
        "- Point to status.nimbus.cloud for incidents. Do not guess at a root cause.",
    ),
    "account": (
        "Account Security",
        "- Never change access or reveal account details in the reply.\n"
        "- Ask the customer to confirm ownership from the account's email address.\n"
        "- For lost two-factor devices, explain the recovery-code process.",
    ),
}

# First-response targets, in hours, by priority.
RESPONSE_HOURS = {"urgent": 1, "high": 4, "normal": 24, "low": 72}


def load_state() -> dict:
    if path := os.environ.get("GRAPH_STATE_FILE"):
        with open(path) as f:
            return json.load(f)
    return json.loads(os.environ.get("GRAPH_STATE", "{}"))


state = load_state()
category = state.get("category", "other")
priority = state.get("priority", "normal")
out = {"response_hours": RESPONSE_HOURS.get(priority, 24)}
if category in TEAMS:
    team, playbook = TEAMS[category]
    out.update(team=team, playbook=playbook, _next="draft_reply")
else:
    out.update(
        handoff=f"not a support request (category '{category}'); forward it to the "
        "sales and feedback inbox",
        _next="needs_human",
    )
print(json.dumps(out))
