"""``graphrun audit --verify``'s signature report: a run tree in a store, or an export file.

Each decision of each run is checked by :func:`~graphrun.runtime.decisions.verify.check_run`
against an allowed_signers file; an export file is checked on its own (its hash chain
and trailer first), with no database.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphrun.runtime.decisions import Trust
from graphrun.runtime.decisions.verify import check_run

__all__ = ["format_report", "verify_export", "verify_store"]


def verify_store(store: Any, run_id: str, trust: Trust) -> dict[str, Any]:
    """The signature report of ``run_id`` and its descendants in ``store``:
    ``{"decisions": [...], "heads": [...], "ok": bool}``."""
    from graphrun.runtime.replay.transfer import run_tree

    decisions: list[dict[str, Any]] = []
    heads: list[dict[str, Any]] = []
    cache: dict[str, dict[int, str] | None] = {}

    def hashes_of(rid: str) -> dict[int, str] | None:
        if rid not in cache:
            cache[rid] = (
                {seq: digest for seq, _b, _p, digest in store.raw_rows(rid)}
                if store.has_run(rid)
                else None
            )
        return cache[rid]

    for rid in run_tree(store, run_id):
        events = store.read(rid)
        hashes = hashes_of(rid) or {}
        checks, head = check_run(
            events, hashes, trust, live=store.is_live(rid), hashes_of=hashes_of
        )
        decisions += [c.to_dict() for c in checks]
        if head is not None:
            heads.append(head.to_dict())
    return _summed(decisions, heads)


def verify_export(path: Path, trust: Trust) -> dict[str, Any]:
    """The signature report of every run in an export file (no database).

    Raises:
        ExportFileError: The file's chain or trailer does not verify.
    """
    from graphrun.runtime.replay.transfer import read_export

    hashes: dict[str, dict[int, str]] = {}
    runs = read_export(path, hashes=hashes, check_approvals=False)
    decisions: list[dict[str, Any]] = []
    heads: list[dict[str, Any]] = []
    for rid, events in runs.items():
        checks, head = check_run(events, hashes.get(rid, {}), trust, hashes_of=hashes.get)
        decisions += [c.to_dict() for c in checks]
        if head is not None:
            heads.append(head.to_dict())
    return _summed(decisions, heads)


def _summed(decisions: list[dict[str, Any]], heads: list[dict[str, Any]]) -> dict[str, Any]:
    ok = all(d["identity"] != "broken" for d in decisions) and all(h["ok"] for h in heads)
    counts: dict[str, int] = {}
    for d in decisions:
        counts[d["identity"]] = counts.get(d["identity"], 0) + 1
    return {"ok": ok, "counts": counts, "decisions": decisions, "heads": heads}


def format_report(report: dict[str, Any]) -> list[str]:
    """One line per decision and per run's signed heads, for stderr."""
    lines = []
    for d in report["decisions"]:
        what = f"run {d['run_id']} seq {d['seq']} node '{d['node_id']}' visit {d['visit']}"
        said = f"{d['answer']!r} by {d['by']}"
        if d["cosignature"]:
            said += " (co-signature)"
        if d["identity"] == "broken":
            lines.append(f"BROKEN: {what}: {said}: {d['problem']}")
        elif d["identity"] == "verified":
            carried = f", carried from run {d['carried_from']}" if d["carried_from"] else ""
            lines.append(f"verified: {what}: {said} (key {d['key']}{carried})")
        else:
            lines.append(f"{d['identity']}: {what}: {said} (no signature)")
    for h in report["heads"]:
        if h["ok"]:
            lines.append(f"ok: run {h['run_id']}: {h['signed']} signed head(s) (key {h['key']})")
        else:
            lines.append(f"BROKEN: run {h['run_id']}: {h['problem']}")
    return lines
