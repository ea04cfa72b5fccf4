#!/usr/bin/env python3
"""List the files to triage (relative to the agent directory)."""
import json
import os
import sys
from pathlib import Path


def load_state():
    if path := os.environ.get("GRAPH_STATE_FILE"):
        with open(path) as f:
            return json.load(f)
    return json.loads(os.environ.get("GRAPH_STATE", "{}"))


state = load_state()
folder = Path(state.get("folder") or "inbox")
if not folder.is_dir():
    print(f"no folder {folder}", file=sys.stderr)
    sys.exit(1)
files = sorted(str(p) for p in folder.rglob("*") if p.is_file())
print(json.dumps({"files": files, "total": len(files), "index": 0, "findings": []}))
