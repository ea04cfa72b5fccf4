"""Check the map's findings: how many came back, and whether any is empty."""

import json
import os

state = json.loads(os.environ["GRAPH_STATE"])
findings = state.get("findings", [])
empty = sum(1 for f in findings if not str(f or "").strip())
print(
    json.dumps(
        {
            "coverage": len(findings),
            "notes": f"checked {len(findings)} findings, {empty} empty",
        }
    )
)
