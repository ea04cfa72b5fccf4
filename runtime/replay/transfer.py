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
* Version 2 adds a last line, the trailer: per run its event count and head
  hash, ``{"trailer": {"runs": {"<run id>": {"events": 12, "head": "sha256:<hex>"}}}}``.
  A version-2 file without it, or whose runs end elsewhere, was cut or added to
  and is refused. Version-1 files (no trailer) still import.
* Compatibility: event types only gain optional fields, so every version-1 file
  keeps loading; ``replays/format-v1.run.jsonl`` is replayed by the test suite
  to prove it. A change that old readers cannot read bumps ``version``.

An import treats the file as untrusted: every run id is checked, each run starts
with ``RunStarted``, parents form no cycle (with the runs already in the
database), approvals are re-checked against the node's approvers, and nothing is
written unless every run in the file can be.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

import msgspec

from graphrun.eventstore import codec
from graphrun.eventstore.events import (
    SCHEMA_VERSION,
    ApprovalSigned,
    Event,
    HeadSigned,
    HumanInputReceived,
    RunStarted,
)
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.lifecycle import run_tree
from graphrun.runtime.errors import GraphrunError

FORMAT = "graphrun-export"
FORMAT_VERSION = 2
SUPPORTED_VERSIONS = (1, 2)
#: The first version whose files must end with a trailer.
TRAILER_VERSION = 2
#: What a run id in a file may look like (ids graphrun makes are 18 base32 characters).
RUN_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z_.:-]{0,127}")


class _Line(msgspec.Struct):
    """One event line of an export file."""

    hash: str
    event: msgspec.Raw


class ExportFileError(GraphrunError):
    """An export file cannot be read."""


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
    ``with_origin`` the events are written exactly as stored, as they always are
    when a run holds signed decisions or signed heads (:func:`has_signatures`)."""
    import os

    runs = run_tree(store, run_id)
    if not with_origin and has_signatures(store, runs):
        # Signatures are bound to the log's hashes: a portable rewrite would
        # change them, so a signed run travels exactly as stored.
        with_origin = True
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
    heads: dict[str, dict[str, Any]] = {}
    for rid in runs:
        prev = codec.GENESIS
        users = _os_users(store, rid) if not with_origin else set()
        project = _project(base, store.run(rid).agent_dir)
        for _seq, body, _prev, digest in store.raw_rows(rid):
            if not with_origin:
                body = _portable(body, base, users, project)
                digest = codec.chain_hash(prev, body)
                prev = digest
            fh.write('{"hash":"' + digest + '","event":' + body.decode("utf-8") + "}\n")
            heads[rid] = {"events": heads.get(rid, {}).get("events", 0) + 1, "head": digest}
            count += 1
    fh.write(json.dumps({"trailer": {"runs": heads}}) + "\n")
    return count


#: Fields that say where and by which process or account a run ran, by event type.
_ORIGIN_FIELDS = {
    "RunStarted": ("host",),
    "RunResumed": ("host", "pid"),
    "HumanInputReceived": ("host", "os_user"),
}
#: Identity fields that hold the OS account unless a name was given with --as.
_ACCOUNT_FIELDS = {
    "RunStarted": "started_by",
    "RunResumed": "by",
    "RunCancelled": "by",
    "RunInterrupted": "by",
}
#: Identity fields an event cannot do without: an OS account there is written as "".
_REQUIRED_ACCOUNT_FIELDS = {"HumanInputReceived": "by"}
#: Paths made relative to the export file.
_PATH_FIELDS = {"RunStarted": ("agent_dir", "graph_path")}
#: Paths in ``RunStarted.config`` (the configuration a run began with), likewise.
_CONFIG_PATHS = ("config_dir", "agents_dir", "loki_dir")


def _os_users(store: SqliteStore, run_id: str) -> set[str]:
    """The OS accounts a run records (and this process's): never written to an export.

    A name that is one of the run's approvers stays: it is the identity an approval
    was given as, and the file's approvals are checked against it on import."""
    import getpass
    import os

    users = set()
    try:
        users.add(getpass.getuser())
    except Exception:  # no account name in this environment
        pass
    if hasattr(os, "getuid"):
        users.add(f"uid:{os.getuid()}")  # what a run records when there is no name
    approvers: set[str] = set()
    for event in store.read(run_id):
        os_user = getattr(event, "os_user", "")
        if os_user:
            users.add(os_user)
        approvers.update(getattr(event, "approvers", None) or ())
    return users - approvers


def _project(base: Path, agent_dir: str | None) -> str:
    """The folder the export file and the run's agent directory share: paths outside
    it (a config directory in the user's home) say where the run was made, not
    where its files are, and are left out of an export."""
    import os

    if not agent_dir or not os.path.isabs(agent_dir):
        return str(base)
    return os.path.commonpath([str(base), str(Path(agent_dir).resolve())])


def _portable(body: bytes, base: Path, os_users: set[str], project: str | None = None) -> bytes:
    """An event's canonical bytes without its origin: no host, OS account or pid;
    paths relative to ``base``; configuration paths outside ``project`` (the folder
    the file and the agent share) left out. Claimed identities (``--as``) and
    answers stay."""
    import os

    data = codec.decode_any(body)
    kind = data.get("type") if isinstance(data, dict) else None
    if (
        kind not in _ORIGIN_FIELDS
        and kind not in _ACCOUNT_FIELDS
        and kind not in _PATH_FIELDS
        and kind not in _REQUIRED_ACCOUNT_FIELDS
    ):
        return body
    for name in _ORIGIN_FIELDS.get(kind, ()):
        data.pop(name, None)
    account = _ACCOUNT_FIELDS.get(kind)
    if account is not None and data.get(account) in os_users:
        data.pop(account)
    account = _REQUIRED_ACCOUNT_FIELDS.get(kind)
    if account is not None and data.get(account) in os_users:
        data[account] = ""
    inside = project or str(base)

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
            value = config.get(name)
            if not value:
                continue
            outside = (
                isinstance(value, str)
                and os.path.isabs(value)
                and os.path.commonpath([inside, os.path.abspath(value)]) != inside
            )
            if outside:
                config.pop(name)
                continue
            config[name] = relative(value)
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
        _REQUIRED_ACCOUNT_FIELDS.get(kind, ""),
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


def _check_run_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not RUN_ID.fullmatch(value):
        shown = repr(value) if not isinstance(value, str) or len(value) <= 40 else repr(value[:40])
        raise ExportFileError(f"{where}: {shown} is not a valid run id")
    return value


def read_export(
    path: Path,
    *,
    hashes: dict[str, dict[int, str]] | None = None,
    check_approvals: bool = True,
) -> dict[str, list[Event]]:
    """Runs in an export file, verified: run id -> events.

    ``hashes``, when given, is filled with each run's chain hash by seq (what signed
    decisions and heads are bound to). ``check_approvals=False`` leaves the answers'
    approver check to the caller (``audit --verify FILE`` reports each one).

    Raises :class:`ExportFileError` (one line, naming the file's line) for anything
    a file made by ``graphrun export`` cannot hold.
    """
    lines = _lines(path)
    first = next(lines, None)
    if first is None:
        raise ExportFileError(f"{path} is empty")
    try:
        header = json.loads(first[1])
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ExportFileError(f"{path}:1: not a graphrun export file")
    version = header.get("version")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise ExportFileError(
            f"{path}:1: export format version {version} is not supported "
            f"(this graphrun reads {', '.join(map(str, SUPPORTED_VERSIONS))})"
        )
    listed = header.get("runs")
    if listed is not None:
        if not isinstance(listed, list):
            raise ExportFileError(f"{path}:1: 'runs' must be a list of run ids")
        for rid in listed:
            _check_run_id(rid, f"{path}:1")
        if len(set(listed)) != len(listed):
            raise ExportFileError(f"{path}:1: 'runs' names a run twice")
    runs: dict[str, list[Event]] = {}
    prev: dict[str, str] = {}
    trailer: Any = None
    trailer_at = ""
    decoder = msgspec.json.Decoder(_Line)
    for number, line in lines:
        where = f"{path}:{number}"
        if trailer is not None:
            raise ExportFileError(f"{where}: a line after the trailer ({trailer_at})")
        if line.lstrip().startswith('{"trailer"'):
            try:
                trailer = json.loads(line)["trailer"]
            except (ValueError, RecursionError, KeyError, TypeError):
                raise ExportFileError(f"{where}: not a valid trailer line") from None
            trailer_at = f"line {number}"
            continue
        try:
            record = decoder.decode(line)
            # The typed decoder straight from the raw bytes (no dict in between).
            event = codec.decode(record.event)
            digest = record.hash
        except codec.DECODE_ERRORS as exc:
            raise ExportFileError(f"{where}: not a valid event line ({exc})") from None
        run_id = _check_run_id(event.run_id, where)
        if listed is not None and run_id not in listed:
            raise ExportFileError(f"{where}: run {run_id} is not among the header's runs")
        events = runs.setdefault(run_id, [])
        if event.seq != len(events) + 1:
            raise ExportFileError(
                f"{where}: run {run_id} jumps to seq {event.seq} after {len(events)}"
            )
        if not events and type(event).__name__ != "RunStarted":
            raise ExportFileError(
                f"{where}: run {run_id} starts with {type(event).__name__}, not RunStarted"
            )
        if events and type(event).__name__ == "RunStarted":
            raise ExportFileError(f"{where}: run {run_id} starts a second time")
        # Over the bytes as written: a field this version does not know still verifies.
        expected = codec.chain_hash(prev.get(run_id, codec.GENESIS), bytes(record.event))
        if expected != digest:
            raise ExportFileError(
                f"{where}: event {run_id}#{event.seq} does not match its hash "
                "(the file was edited or damaged)"
            )
        prev[run_id] = digest
        if hashes is not None:
            hashes.setdefault(run_id, {})[event.seq] = digest
        events.append(event)
    if trailer is not None or version >= TRAILER_VERSION:
        _check_trailer(path, trailer, trailer_at, runs, prev)
    if listed is not None and set(listed) != set(runs):
        missing = sorted(set(listed) - set(runs))
        raise ExportFileError(f"{path}: the header lists run {missing[0]}, which has no events")
    _check_parents(path, runs)
    if check_approvals:
        _check_approvals(path, runs)
    return runs


def _check_trailer(
    path: Path,
    trailer: Any,
    at: str,
    runs: dict[str, list[Event]],
    heads: dict[str, str],
) -> None:
    """The trailer names every run with its event count and head hash."""
    if trailer is None:
        raise ExportFileError(
            f"{path}: the file ends without its trailer: it was cut short",
            hint="export the run again",
        )
    counted = trailer.get("runs") if isinstance(trailer, dict) else None
    if not isinstance(counted, dict):
        raise ExportFileError(f"{path} ({at}): the trailer has no 'runs'")
    for run_id in sorted(set(counted) | set(runs)):
        want = counted.get(run_id)
        have = len(runs.get(run_id, []))
        if not isinstance(want, dict) or want.get("events") != have:
            expected = want.get("events") if isinstance(want, dict) else 0
            raise ExportFileError(
                f"{path} ({at}): run {run_id} has {have} events here, the trailer says "
                f"{expected}: the file was cut or added to"
            )
        if want.get("head") != heads.get(run_id):
            raise ExportFileError(
                f"{path} ({at}): run {run_id} does not end with the trailer's head hash"
            )


def _check_parents(path: Path, runs: dict[str, list[Event]]) -> None:
    """No run is its own ancestor (within the file)."""
    parent = {
        rid: getattr(events[0], "parent_run_id", None) for rid, events in runs.items() if events
    }
    for rid in runs:
        seen = {rid}
        up = parent.get(rid)
        while up is not None:
            if up in seen:
                raise ExportFileError(f"{path}: run {rid} is its own ancestor (through {up})")
            seen.add(up)
            up = parent.get(up)


def _check_approvals(path: Path, runs: dict[str, list[Event]], *, disk: bool = False) -> None:
    """Every recorded answer is one the run's own graph allows: by one of the node's
    approvers (compared exactly), signed where the graph requires it. The graph is
    the run's recorded source and, with ``disk`` (an import), its graph.yaml next to
    the file when it is there (they must agree); never the approvers copied into
    the recorded question."""
    from graphrun.runtime.decisions.policy import PolicyError, governing_policy

    for run_id, events in runs.items():
        policies: dict[str, Any] = {}
        for event in events:
            if not isinstance(event, HumanInputReceived | ApprovalSigned):
                continue
            node = event.node_id
            try:
                if node not in policies:
                    policies[node] = governing_policy(events, node, disk=disk, base=path.parent)
            except PolicyError as exc:
                raise ExportFileError(f"{path}: run {run_id}: {exc.message}") from None
            policy = policies[node]
            where = f"{path}: run {run_id} seq {event.seq}"
            if not policy.allows(event.by):
                raise ExportFileError(
                    f"{where}: an answer by {event.by!r} at node '{node}', whose "
                    f"approvers are {', '.join(policy.approvers)}"
                )
            if policy.signed and not (event.signature and event.statement):
                raise ExportFileError(
                    f"{where}: an unsigned answer at node '{node}', which requires signed answers"
                )


def has_signatures(store: SqliteStore, runs: list[str]) -> bool:
    """Whether any of ``runs`` holds a signed answer or a signed head (their bytes
    and hashes must then be exported exactly as stored)."""
    for rid in runs:
        for event in store.read(rid):
            if isinstance(event, HeadSigned):
                return True
            if isinstance(event, HumanInputReceived | ApprovalSigned) and event.statement:
                return True
    return False


def import_runs(
    store: SqliteStore,
    path: Path,
    *,
    trusted_dirs: list[Path] | None = None,
    against_disk: bool = False,
) -> list[tuple[str, str]]:
    """Load runs from an export file; returns ``(run_id, "imported"|"present")`` pairs.

    Every run is checked before any is written: a file with one new run and one
    that conflicts with the database imports nothing. With ``trusted_dirs`` (what
    the user named), a run that could still go on (not ended) is refused unless
    its agent directory is one of them: resuming it runs that folder's scripts.
    With ``against_disk`` (``graphrun import``), every recorded answer is also
    checked against the agent's graph.yaml beside the file, when it is there.
    """
    runs = read_export(path)
    if against_disk:
        _check_approvals(path, runs, disk=True)
    if trusted_dirs is not None:
        _check_agent_dirs(path, runs, trusted_dirs)
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
        else:
            out.append((run_id, "imported"))
    for run_id, events in runs.items():
        parent = getattr(events[0], "parent_run_id", None)
        seen = {run_id}
        while parent is not None and parent not in runs:
            if parent in seen or not store.has_run(parent):
                break
            seen.add(parent)
            parent = store.run(parent).parent_run_id
            if parent == run_id:
                raise ExportFileError(f"{path}: run {run_id} would become its own ancestor")
    for run_id, status in out:
        if status == "imported":
            store.append(run_id, _anchored(runs[run_id], path.parent))
    return out


def _anchored(events: list[Event], folder: Path) -> list[Event]:
    """The run as this machine stores it: the relative paths of its ``RunStarted``
    (the agent directory, graph.yaml, configuration directories; relative to the
    file's folder) made absolute, so that resuming or forking it runs the scripts
    next to the file, as a run recorded here would. Exporting it again makes them
    relative again; importing the file a second time finds the same run."""
    import os

    first = events[0] if events else None
    if not isinstance(first, RunStarted):
        return events

    def absolute(value: str) -> str:
        if value and not os.path.isabs(value):
            return os.path.normpath(os.path.join(folder.resolve(), value))
        return value

    config = dict(first.config)
    for name in _CONFIG_PATHS:
        if isinstance(config.get(name), str):
            config[name] = absolute(config[name])
    fixed = msgspec.structs.replace(
        first,
        agent_dir=absolute(first.agent_dir),
        graph_path=absolute(first.graph_path),
        config=config,
    )
    return [fixed, *events[1:]] if fixed != first else events


def _check_agent_dirs(path: Path, runs: dict[str, list[Event]], trusted: list[Path]) -> None:
    import os

    from graphrun.eventstore.fold import fold

    named = {os.path.realpath(d) for d in trusted}
    for run_id, events in runs.items():
        if fold(events).terminal:
            continue  # an ended run is never resumed: nothing of the file runs
        agent_dir = getattr(events[0], "agent_dir", "") or ""
        where = os.path.realpath(path.parent / agent_dir) if agent_dir else ""
        if where not in named:
            raise ExportFileError(
                f"{path}: run {run_id} has not ended and would run the scripts of "
                f"{agent_dir or 'an unnamed agent directory'}",
                hint=f"import with --agent-dir {agent_dir} if you trust that folder"
                if agent_dir
                else "only ended runs can be imported",
            )


def anchor_of(store: SqliteStore, run_id: str) -> str:
    """The run's head as an anchor to keep elsewhere: ``<run id>@<seq>:sha256:<hex>``."""
    row = store.run(run_id)
    return f"{run_id}@{row.last_seq}:{row.last_hash}"


def check_anchor(store: SqliteStore, run_id: str, anchor: str) -> tuple[int, str | None]:
    """Whether the run's log still holds ``anchor`` at its seq, recomputing the chain.

    Returns ``(seq, None)`` when every event up to that seq is unchanged, else
    ``(seq, reason)``. A chain recomputed after an edit, a cut below the anchor or
    another run's anchor all fail: the recomputed hash at that seq differs.
    """
    from graphrun.runtime.errors import UsageError

    match = re.fullmatch(
        r"(?:(?P<run>[^@\s]+)@)?(?P<seq>[0-9]+):(?P<hash>sha256:[0-9a-f]{64})", anchor
    )
    if match is None:
        raise UsageError(
            f"--anchor {anchor[:80]!r} is not an anchor",
            hint="anchors look like RUN@SEQ:sha256:<hex>, as `graphrun audit RUN --anchor` prints",
        )
    if match["run"] is not None and match["run"] != run_id:
        raise UsageError(f"--anchor belongs to run {match['run']}, not {run_id}")
    seq, want = int(match["seq"]), match["hash"]
    prev = codec.GENESIS
    for number, body, _stored_prev, _stored in store.raw_rows(run_id):
        prev = codec.chain_hash(prev, body)
        if number == seq:
            if prev != want:
                return seq, "the events up to it are not those anchored (changed or rewritten)"
            return seq, None
    return seq, f"the log ends before seq {seq} (cut)"


def top_level_runs(path: Path) -> list[str]:
    """The runs in an export file that are not a child of another run in it."""
    runs = read_export(path)
    out = []
    for run_id, events in runs.items():
        parent = getattr(events[0], "parent_run_id", None) if events else None
        if parent is None or parent not in runs:
            out.append(run_id)
    return out
