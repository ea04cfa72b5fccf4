"""Recorded runs as files: a versioned JSON-lines format (``graphrun export``/``import``).

Format ``graphrun-export``, version 1 (documented in ``docs/recorded-runs.md``)::

    {"format": "graphrun-export", "version": 1, "event_schema": 1,
     "runs": ["<root run id>", "<child run id>", ...],
     "agent_dirs": {"<run id>": "<agent dir relative to this file>", ...}}
    {"hash": "sha256:<hex>", "event": {"type": "RunStarted", "run_id": ..., "seq": 1, ...}}
    {"hash": "sha256:<hex>", "event": {"type": "NodeEntered", ...}}
    ...

* Line 1 is the header. ``version`` is this file format's version (readers refuse
  a version they do not know); ``event_schema`` is the event schema version the
  events were written with; ``runs`` lists the runs in the file, the exported
  run first, then its descendants (parents before children); ``agent_dirs``
  (optional, written by ``export -o FILE``) says where each run's agent directory
  is relative to the file, so ``graphrun test`` finds it wherever the repository
  is checked out; ``sources`` (optional) holds, per run, the text of each script
  file that was still unchanged at export time (``{"<run id>": {"scripts/x.py":
  "<text>"}}``), so a later change to a script is reported as a text diff.
  Unknown header keys are ignored.
* Every following line is one event, in run then seq order: ``event`` is the
  event's canonical JSON exactly as stored (tagged by ``type``; the fields of
  each type are in ``eventstore/events.py``), ``hash`` its hash-chain value:
  ``sha256(previous hash + canonical event bytes)``, starting from the genesis
  value for seq 1. Import recomputes every hash and refuses a file whose events
  were edited, reordered or lost; seqs run 1, 2, 3... per run with no gap.
* Unless exported with ``--with-origin`` (header ``"origin": "omitted"``), the
  events leave out host names, OS accounts and process ids, and their paths are
  relative to the file's folder; the hashes are those of the events as written.
* Compatibility: event types only gain optional fields, so every version-1 file
  keeps loading; ``replays/format-v1.run.jsonl`` is replayed by the test suite
  to prove it. A change that old readers cannot read bumps ``version``.
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


class _Line(msgspec.Struct):
    """One event line of an export file."""

    hash: str
    event: msgspec.Raw


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
    store: SqliteStore,
    run_id: str,
    fh: TextIO,
    *,
    relative_to: Path | None = None,
    with_origin: bool = False,
) -> int:
    """Write a run and its descendants. With ``relative_to`` (the file's folder) the
    header also records each run's agent directory relative to it, so
    ``graphrun test`` finds the agents wherever the repository is checked out.

    Unless ``with_origin``, the events say nothing about the machine they ran on:
    paths are made relative to ``relative_to`` (else the working directory), and
    host names, OS accounts and process ids are left out (see :func:`_portable`);
    the file's hash chain is computed over the events as written. With
    ``with_origin`` the events are written exactly as stored."""
    import os

    runs = run_tree(store, run_id)
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "event_schema": SCHEMA_VERSION,
        "runs": runs,
    }
    if not with_origin:
        header["origin"] = "omitted"
    if relative_to is not None:
        dirs = {}
        for rid in runs:
            agent_dir = store.run(rid).agent_dir
            if agent_dir:
                dirs[rid] = os.path.relpath(agent_dir, relative_to.resolve())
        header["agent_dirs"] = dirs
    sources = {rid: found for rid in runs if (found := _script_sources(store, rid))}
    if sources:
        header["sources"] = sources
    fh.write(json.dumps(header) + "\n")
    count = 0
    base = (relative_to or Path.cwd()).resolve()
    for rid in runs:
        prev = codec.GENESIS
        users = _os_users(store, rid) if not with_origin else set()
        for _seq, body, _prev, digest in store.raw_rows(rid):
            if not with_origin:
                body = _portable(body, base, users)
                digest = codec.chain_hash(prev, body)
                prev = digest
            fh.write('{"hash":"' + digest + '","event":' + body.decode("utf-8") + "}\n")
            count += 1
    return count


#: Fields that say where and by which process or account a run ran, by event type.
_ORIGIN_FIELDS = {
    "RunStarted": ("host",),
    "RunResumed": ("host", "pid"),
    "HumanInputReceived": ("host", "os_user"),
}
#: Identity fields that hold the OS account unless a name was given with --as.
_ACCOUNT_FIELDS = {"RunStarted": "started_by", "RunResumed": "by", "RunCancelled": "by"}
#: Paths made relative to the export file.
_PATH_FIELDS = {"RunStarted": ("agent_dir", "graph_path")}
#: Paths in ``RunStarted.config`` (the configuration a run began with), likewise.
_CONFIG_PATHS = ("config_dir", "agents_dir", "loki_dir")


def _os_users(store: SqliteStore, run_id: str) -> set[str]:
    """The OS accounts a run records (and this process's): never written to an export."""
    import getpass

    users = set()
    try:
        users.add(getpass.getuser())
    except Exception:  # no account name in this environment
        pass
    for event in store.read(run_id):
        os_user = getattr(event, "os_user", "")
        if os_user:
            users.add(os_user)
    return users


def _portable(body: bytes, base: Path, os_users: set[str]) -> bytes:
    """An event's canonical bytes without its origin: no host, OS account or pid;
    paths relative to ``base``. Claimed identities (``--as``) and answers stay."""
    import os

    data = codec.decode_any(body)
    kind = data.get("type") if isinstance(data, dict) else None
    if kind not in _ORIGIN_FIELDS and kind not in _ACCOUNT_FIELDS and kind not in _PATH_FIELDS:
        return body
    for name in _ORIGIN_FIELDS.get(kind, ()):
        data.pop(name, None)
    account = _ACCOUNT_FIELDS.get(kind)
    if account is not None and data.get(account) in os_users:
        data.pop(account)

    def relative(value: Any) -> Any:
        if isinstance(value, str) and os.path.isabs(value):
            return Path(os.path.relpath(value, base)).as_posix()
        return value

    for name in _PATH_FIELDS.get(kind, ()):
        if data.get(name):
            data[name] = relative(data[name])
    config = data.get("config") if kind == "RunStarted" else None
    if isinstance(config, dict):
        for name in _CONFIG_PATHS:
            if config.get(name):
                config[name] = relative(config[name])
    return codec.encode_any(data)


def _sans_origin(event: Event) -> dict[str, Any]:
    """An event without the fields an export may leave out or make relative: the
    same run exported with or without ``--with-origin`` imports as the same run."""
    data = codec.to_builtins(event)
    kind = data.get("type", "")
    for name in (
        *_ORIGIN_FIELDS.get(kind, ()),
        *_PATH_FIELDS.get(kind, ()),
        _ACCOUNT_FIELDS.get(kind, ""),
    ):
        data.pop(name, None)
    config = data.get("config") if kind == "RunStarted" else None
    if isinstance(config, dict):
        data["config"] = {k: v for k, v in config.items() if k not in _CONFIG_PATHS}
    return data


#: Script files larger than this are not copied into an export header.
SOURCE_LIMIT = 64 * 1024


def _script_sources(store: SqliteStore, run_id: str) -> dict[str, str]:
    """The texts of the run's script files that are still exactly as they ran."""
    first = store.read(run_id, upto=1)[0]
    files = getattr(first, "files", None) or {}
    agent_dir = Path(getattr(first, "agent_dir", "") or ".")
    out = {}
    for name, digest in sorted(files.items()):
        try:
            data = (agent_dir / name).read_bytes()
        except OSError:
            continue
        if len(data) > SOURCE_LIMIT or codec.content_hash(data) != digest:
            continue
        try:
            out[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
    return out


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
    decoder = msgspec.json.Decoder(_Line)
    for number, line in lines:
        where = f"{path}:{number}"
        try:
            record = decoder.decode(line)
            # The typed decoder straight from the raw bytes (no dict in between).
            event = codec.decode(record.event)
            digest = record.hash
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ExportFileError(f"{where}: not a valid event line ({exc})") from None
        events = runs.setdefault(event.run_id, [])
        if event.seq != len(events) + 1:
            raise ExportFileError(
                f"{where}: run {event.run_id} jumps to seq {event.seq} after {len(events)}"
            )
        # Over the bytes as written: a field this version does not know still verifies.
        expected = codec.chain_hash(prev.get(event.run_id, codec.GENESIS), bytes(record.event))
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
                codec.encode(a) == codec.encode(b) or _sans_origin(a) == _sans_origin(b)
                for a, b in zip(existing, events, strict=False)
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


def top_level_runs(path: Path) -> list[str]:
    """The runs in an export file that are not a child of another run in it."""
    runs = read_export(path)
    out = []
    for run_id, events in runs.items():
        parent = getattr(events[0], "parent_run_id", None) if events else None
        if parent is None or parent not in runs:
            out.append(run_id)
    return out
