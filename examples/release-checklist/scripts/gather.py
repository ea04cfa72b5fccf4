#!/usr/bin/env python3
"""Gather the facts of the release from VERSION and CHANGELOG.md; prepare the checklist.

Fails (exit 1, routed to the graph's fallback) when the version has no changelog
section: there is nothing to review then.
"""

import json
import os
import re
import sys
from pathlib import Path

SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")
HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>.+))?$")


def load_state() -> dict:
    if path := os.environ.get("GRAPH_STATE_FILE"):
        with open(path) as f:
            return json.load(f)
    return json.loads(os.environ.get("GRAPH_STATE", "{}"))


def sections(changelog: str) -> list[dict]:
    """The changelog's release sections, newest first, with their entries."""
    found: list[dict] = []
    category = ""
    for line in changelog.splitlines():
        if m := HEADING.match(line.strip()):
            found.append({"version": m["version"], "date": m["date"], "entries": []})
            category = ""
        elif line.startswith("### ") and found:
            category = line[4:].strip()
        elif line.startswith("- ") and found:
            found[-1]["entries"].append({"category": category, "text": line[2:].strip()})
    return found


def render(checklist: list[dict]) -> str:
    return "\n".join(f"[{'x' if c['ok'] else ' '}] {c['item']}" for c in checklist)


def main() -> int:
    state = load_state()
    version = Path("VERSION").read_text(encoding="utf-8").strip()
    releases = sections(Path("CHANGELOG.md").read_text(encoding="utf-8"))
    current = next((r for r in releases if r["version"] == version), None)
    if current is None:
        print(f"CHANGELOG.md has no section for version {version}", file=sys.stderr)
        return 1
    older = [r for r in releases if r is not current]
    previous = older[0]["version"] if older else None
    entries = current["entries"]
    breaking = [e for e in entries if "BREAKING" in e["text"] or e["category"] == "Removed"]
    has_upgrade_notes = any(e["category"].lower().startswith("upgrad") for e in entries)
    newer = bool(
        SEMVER.match(version)
        and (
            previous is None
            or not SEMVER.match(previous)
            or tuple(map(int, version.split("."))) > tuple(map(int, previous.split(".")))
        )
    )
    checklist = [
        {"item": f"VERSION is a semantic version ({version})", "ok": bool(SEMVER.match(version))},
        {"item": f"CHANGELOG.md has a section for {version}", "ok": True},
        {
            "item": f"the section is dated ({current['date'] or 'no date'})",
            "ok": bool(current["date"]) and "unreleased" not in current["date"].lower(),
        },
        {"item": f"{version} is newer than the last release ({previous})", "ok": newer},
        {
            "item": f"{len(breaking)} breaking change(s) come with upgrade notes",
            "ok": not breaking or has_upgrade_notes,
        },
    ]
    print(
        json.dumps(
            {
                "version": version,
                "previous_version": previous,
                "change_count": len(entries),
                "breaking": [e["text"] for e in breaking],
                "breaking_count": len(breaking),
                "checklist": checklist,
                "checklist_text": render(checklist),
                "open_items": sum(not c["ok"] for c in checklist),
                "notes": state.get("notes") or [],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
