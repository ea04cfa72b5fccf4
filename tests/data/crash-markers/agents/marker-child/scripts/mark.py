"""Appends a marker to the top agent's markers.txt; counts the child's steps."""

import json
import os
from pathlib import Path

state = json.loads(os.environ["GRAPH_STATE"])
marks = state.get("marks", 0) + 1
with open(Path(__file__).resolve().parents[3] / "markers.txt", "a") as fh:
    fh.write(f"child {state['initial_prompt']} {marks}\n")
print(json.dumps({"marks": marks}))
