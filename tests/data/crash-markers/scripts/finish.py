"""The last step: appends its marker and writes the report."""

import json
import os
from pathlib import Path

state = json.loads(os.environ["GRAPH_STATE"])
with open(Path(__file__).resolve().parents[1] / "markers.txt", "a") as fh:
    fh.write(f"finish {state['name']}\n")
print(json.dumps({"report": f"{state['n']} steps signed by {state['name']}"}))
