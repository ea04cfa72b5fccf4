#!/usr/bin/env bash
# Classify one file per visit; route back here with _next until every file is seen.
set -euo pipefail
state="${GRAPH_STATE:-$(cat "${GRAPH_STATE_FILE}")}"
python3 - "$state" <<'PY'
import json, sys
from pathlib import Path

state = json.loads(sys.argv[1])
files, i = state["files"], state["index"]
if i >= len(files):
    print(json.dumps({"_next": "summarize", "current": None}))
    sys.exit(0)
path = Path(files[i])
data = path.read_bytes()
text = data.decode("utf-8", errors="replace")
finding = {"file": str(path), "bytes": len(data)}
if b"\0" in data[:1024]:
    finding.update(kind="binary", flag="unexpected binary file")
elif path.suffix == ".log":
    errors = sum("ERROR" in line for line in text.splitlines())
    finding.update(kind="log", flag=f"{errors} ERROR lines" if errors else None)
elif "TODO" in text or "FIXME" in text:
    finding.update(kind="note", flag="has open TODO/FIXME")
elif len(data) == 0:
    finding.update(kind="empty", flag="empty file")
else:
    finding.update(kind=path.suffix.lstrip(".") or "text", flag=None)
out = {"findings": state["findings"] + [finding], "index": i + 1, "current": str(path)}
out["_next"] = "inspect" if i + 1 < len(files) else "summarize"
print(json.dumps(out))
PY
