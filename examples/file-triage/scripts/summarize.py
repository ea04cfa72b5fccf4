#!/usr/bin/env python3
"""Turn the findings into a report, flagged files first."""
import json
import os


def load_state():
    if path := os.environ.get("GRAPH_STATE_FILE"):
        with open(path) as f:
            return json.load(f)
    return json.loads(os.environ.get("GRAPH_STATE", "{}"))


state = load_state()
findings = state.get("findings", [])
flagged = [f for f in findings if f.get("flag")]
lines = [f"  ! {f['file']}: {f['flag']}" for f in flagged]
quiet = [f for f in findings if not f.get("flag")]
lines += [f"    {f['file']}: {f['kind']}, {f['bytes']} bytes" for f in quiet]
print(json.dumps({"report": "\n".join(lines), "flagged_count": len(flagged)}))
