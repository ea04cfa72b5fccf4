"""One step of three: appends its marker, then loops via _next."""

import json
import os
from pathlib import Path

state = json.loads(os.environ["GRAPH_STATE"])
n = state["n"] + 1
with open(Path(__file__).resolve().parents[1] / "markers.txt", "a") as fh:
    fh.write(f"step {n}\n")
print(json.dumps({"n": n, "_next": "step" if n < 3 else "ask"}))
