"""Exported runs: a versioned JSON-lines file.

Line 1 is a header ``{"format": "graphrun-export", "version": 1, "event_schema": 1,
"runs": [...]}``; every following line is ``{"hash": "sha256:…", "event": {…}}`` in
run then seq order (child runs follow their parent). The hash is the event's
hash-chain value in the log it came from; import recomputes and checks it, so a
damaged or edited file is refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import msgspec

from graphrun.eventstore import codec
from graphrun.eventstore.events import SCHEMA_VERSION, Event
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.errors import GraphrunError

FORMAT = "graphrun-export"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)


class ExportFileError(GraphrunError):
    """An export file cannot be read."""


def run_tree(store: SqliteStore, run_id: str) -> list[str]:
    """A run and its descendants, parents first."""
    out = [run_id]
    i = 0
    while i < len(out):
        out.extend(
            row.run_id for row in sorted(store.runs(parent=out[i]), key=lambda r: r.started_at)
        )
        i += 1
    return out


def write_export(
    store: SqliteStore, run_id: str, fh: TextIO, *, relative_to: Path | None = None
) -> int:
    """Write a run and its descendants. With ``relative_to`` (the file's folder) the
    header also records each run's agent directory relative to it, so
    ``graphrun test`` finds the agents wherever the repository is checked out."""
    import os

    runs = run_tree(store, run_id)
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "event_schema": SCHEMA_VERSION,
        "runs": runs,
    }
    if relative_to is not None:
        dirs = {}
        for rid in runs:
            agent_dir = store.run(rid).agent_dir
            if agent_dir:
                dirs[rid] = os.path.relpath(agent_dir, relative_to.resolve())
        header["agent_dirs"] = dirs
    fh.write(json.dumps(header) + "\n")
    count = 0
    for rid in runs:
        for _seq, body, _prev, digest in store.raw_rows(rid):
            fh.write('{"hash":"' + digest + '","event":' + body.decode("utf-8") + "}\n")
            count += 1
    return count


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if line.strip():
                    yield number, line
    except (OSError, UnicodeDecodeError) as exc:
        raise ExportFileError(f"cannot read {path}: {exc}") from None


def read_header(path: Path) -> dict[str, Any]:
    for _number, line in _lines(path):
        try:
            header = json.loads(line)
        except ValueError:
            break
        if isinstance(header, dict):
            return header
        break
    raise ExportFileError(f"{path}:1: not a graphrun export file")


def read_export(path: Path) -> dict[str, list[Event]]:
    """Runs in an export file, verified: run id -> events."""
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise ExportFileError(f"{path} is empty")
    try:
        header = json.loads(first[1])
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ExportFileError(f"{path}:1: not a graphrun export file")
    version = header.get("version")
    if version not in SUPPORTED_VERSIONS:
        raise ExportFileError(
            f"{path}:1: export format version {version} is not supported "
            f"(this graphrun reads {', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    runs: dict[str, list[Event]] = {}
    prev: dict[str, str] = {}
    decoder = msgspec.json.Decoder(dict[str, Any])
    for number, line in lines:
        where = f"{path}:{number}"
        try:
            record = decoder.decode(line)
            event = codec.from_builtins(record["event"])
            digest = record["hash"]
        except (msgspec.DecodeError, msgspec.ValidationError, KeyError, TypeError) as exc:
            raise ExportFileError(f"{where}: not a valid event line ({exc})") from None
        events = runs.setdefault(event.run_id, [])
        if event.seq != len(events) + 1:
            raise ExportFileError(
                f"{where}: run {event.run_id} jumps to seq {event.seq} after {len(events)}"
            )
        expected = codec.chain_hash(prev.get(event.run_id, codec.GENESIS), codec.encode(event))
        if expected != digest:
            raise ExportFileError(
                f"{where}: event {event.run_id}#{event.seq} does not match its hash "
                "(the file was edited or damaged)"
            )
        prev[event.run_id] = digest
        events.append(event)
    return runs


def import_runs(store: SqliteStore, path: Path) -> list[tuple[str, str]]:
    """Load runs from an export file; returns ``(run_id, "imported"|"present")`` pairs."""
    runs = read_export(path)
    out = []
    for run_id, events in runs.items():
        if store.has_run(run_id):
            existing = store.read(run_id)
            same = len(existing) >= len(events) and all(
                codec.encode(a) == codec.encode(b) for a, b in zip(existing, events, strict=False)
            )
            if not same:
                raise ExportFileError(
                    f"run {run_id} already exists in {store.path} with different events"
                )
            out.append((run_id, "present"))
            continue
        store.append(run_id, events)
        out.append((run_id, "imported"))
    return out
