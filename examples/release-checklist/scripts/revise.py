#!/usr/bin/env python3
"""Take the reviewer's clarification into the checklist and send it back for approval.

A note starting with "hold" postpones the release (routes to on_hold); any other
note becomes an open checklist item and the release goes back to the gate.
"""

import json
import os


def load_state() -> dict:
    if path := os.environ.get("GRAPH_STATE_FILE"):
        with open(path) as f:
            return json.load(f)
    return json.loads(os.environ.get("GRAPH_STATE", "{}"))


state = load_state()
note = state["note"].strip()
notes = [*state.get("notes", []), note]
if note.lower().startswith("hold"):
    print(json.dumps({"notes": notes, "_next": "on_hold"}))
else:
    checklist = [*state["checklist"], {"item": f"reviewer asked: {note}", "ok": False}]
    text = "\n".join(f"[{'x' if c['ok'] else ' '}] {c['item']}" for c in checklist)
    print(
        json.dumps(
            {
                "notes": notes,
                "checklist": checklist,
                "checklist_text": text,
                "open_items": sum(not c["ok"] for c in checklist),
                "_next": "review",
            }
        )
    )
