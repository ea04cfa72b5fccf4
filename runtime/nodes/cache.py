"""``cache:`` on llm, script and tool nodes: the log is the cache.

A cached node's request is fingerprinted (the node's type and its rendered task,
visit and node id aside, plus the state values its ``key:`` paths name). Before
performing, the driver looks for an earlier run of the same graph name that
performed the same request (its :class:`~graphrun.eventstore.events.CacheChecked`
miss, younger than ``ttl``) and succeeded: its effect events are copied into this
run after a ``CacheChecked`` naming that run and seq. A request that differs in
anything has another key, so a hit never crosses requests. A replay serves the
copied events like any recorded effect.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec

from graphrun.eventstore.events import EFFECT_TYPES, RESULT_TYPES, CacheChecked, Event
from graphrun.runtime.graph.templates import lookup
from graphrun.runtime.nodes.plan import task_fields

#: How many of the graph's newest runs a lookup reads.
SCAN_RUNS = 200


def cache_key(node_type: str, task: Any, key_paths: list[str], state: dict[str, Any]) -> str:
    """The request's fingerprint: ``sha256:`` of its canonical JSON."""
    fields = task_fields(task)
    fields.pop("node_id", None)
    fields.pop("visit", None)
    if key_paths and node_type == "script":
        fields.pop("state_json", None)  # the key paths stand for the state
    keyed = {path: _value(state, path) for path in key_paths}
    text = json.dumps(
        {"type": node_type, "task": fields, "key": keyed},
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _value(state: dict[str, Any], path: str) -> Any:
    found = lookup(state, path)
    return None if found is _missing() else found


def _missing() -> Any:
    from graphrun.runtime.graph.templates import _MISSING

    return _MISSING


def find(
    store: Any, graph_name: str, key: str, *, ttl: float | None, now: float, own_run: str
) -> tuple[CacheChecked, list[Event]] | None:
    """An earlier run's performed effect for ``key``: its miss marker and the effect
    events that followed it (through a result without error), newest run first."""
    for row in store.runs(limit=SCAN_RUNS):
        if row.run_id == own_run or row.graph_name != graph_name:
            continue
        events = store.read(row.run_id)
        for i, event in enumerate(events):
            if not (isinstance(event, CacheChecked) and event.key == key):
                continue
            if event.from_run is not None or (ttl is not None and now - event.ts > ttl):
                continue
            copied = _effect_of(events[i + 1 :], event)
            if copied is not None:
                return event, copied
    return None


def _effect_of(after: list[Event], marker: CacheChecked) -> list[Event] | None:
    out: list[Event] = []
    for event in after:
        same = (
            getattr(event, "node_id", None) == marker.node_id
            and getattr(event, "visit", None) == marker.visit
            and event.branch == marker.branch
        )
        if not same or not isinstance(event, EFFECT_TYPES):
            continue
        out.append(msgspec.structs.replace(event, run_id="", seq=0, ts=0.0))
        if isinstance(event, RESULT_TYPES):
            failed = getattr(event, "error", None) or getattr(event, "extract_error", None)
            return None if failed else out
    return None


__all__ = ["SCAN_RUNS", "cache_key", "find"]
