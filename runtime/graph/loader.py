"""graph.yaml text -> :class:`Graph`, keeping YAML line numbers for every JSON path.

Structural problems (malformed YAML, a duplicate key, an unknown field, a wrong
type, an unknown node type) are collected as :class:`Diagnostic` s pointing at
``file:line ($.path)``; semantic rules live in :mod:`graphrun.runtime.graph.validate`.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from graphrun.eventstore.fold import RunState
from graphrun.runtime.errors import GraphLoadError
from graphrun.runtime.graph.model import NODE_TYPES, Graph, NodeBase

try:  # the C loader is ~10x faster and still gives marks
    _BaseLoader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _BaseLoader = yaml.SafeLoader


class _Loader(_BaseLoader):
    """The safe loader without implicit timestamps: an unquoted date stays a string."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}

#: Limits on a graph file (and on a recorded graph source parsed for replay): its
#: size, how deep its values nest, and how many values it holds once every alias
#: is expanded (a few hundred bytes of nested aliases can stand for billions).
MAX_GRAPH_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
MAX_VALUES = 200_000

_YAML = "tag:yaml.org,2002:"
#: The only scalars graph.yaml may hold: what JSON can say.
_JSON_SCALARS = {f"{_YAML}{t}" for t in ("str", "int", "float", "bool", "null")}


@dataclass(frozen=True)
class Diagnostic:
    """One finding about a graph: an error (the graph cannot run) or a warning."""

    severity: str  # "error" or "warning"
    rule: str  # short rule id, e.g. "unknown-field", "static-cycle"
    message: str
    file: str = "graph.yaml"
    line: int | None = None
    path: str | None = None  # JSON path, e.g. $.nodes.review.routes
    node: str | None = None
    hint: str | None = None

    def format(self) -> str:
        place = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.path:
            place += f" ({self.path})"
        text = f"{place}: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


@dataclass
class LoadedGraph:
    """A parsed graph with where it came from and where each path sits in the YAML."""

    graph: Graph
    source: str
    path: Path
    agent_dir: Path
    lines: dict[str, int] = field(default_factory=dict)
    # State an agent's loader seeds into every run of it (an LLM-loop agent's variables).
    seed_state: dict[str, Any] = field(default_factory=dict)
    # What loading found that does not stop a run (unknown fields Loki would ignore).
    warnings: list[Diagnostic] = field(default_factory=list)

    @property
    def file(self) -> str:
        return str(self.path)

    @functools.cached_property
    def resolved(self) -> tuple[str, str]:
        """The graph file's and the agent directory's real paths (as runs record them)."""
        return str(self.path.resolve()), str(self.agent_dir.resolve())

    def line(self, path: str) -> int | None:
        """The YAML line of a JSON path, or of its closest ancestor."""
        while path:
            if path in self.lines:
                return self.lines[path]
            cut = max(path.rfind("."), path.rfind("["))
            if cut <= 0:
                break
            path = path[:cut]
        return None


def _check_limits(text: str, file: str) -> None:
    """Refuse a file too big, too deep or with too many values after alias expansion.

    Runs over the parser's events (no recursion, nothing expanded), before any tree
    is built: an alias counts the values and the depth of what its anchor holds.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GRAPH_BYTES:
        raise GraphLoadError(
            f"the file is {size:,} bytes; graph files are limited to {MAX_GRAPH_BYTES:,}",
            where=file,
        )
    anchors: dict[str, tuple[int, int]] = {}  # anchor -> (values, height)
    stack: list[list[Any]] = [[None, 0, 0]]  # [anchor, values, height] per open collection

    def add(values: int, height: int, event: Any) -> None:
        frame = stack[-1]
        frame[1] += values
        frame[2] = max(frame[2], height)
        line = event.start_mark.line + 1 if event.start_mark else None
        where = f"{file}:{line}" if line else file
        if len(stack) - 1 + height > MAX_DEPTH:
            raise GraphLoadError(f"values nest deeper than {MAX_DEPTH} levels", where=where)
        if frame[1] > MAX_VALUES:
            raise GraphLoadError(
                f"more than {MAX_VALUES:,} values once aliases are expanded",
                where=where,
                hint="an alias repeats everything its anchor holds",
            )

    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.ScalarEvent):
            add(1, 0, event)
            if event.anchor:
                anchors[event.anchor] = (1, 0)
        elif isinstance(event, yaml.AliasEvent):
            values, height = anchors.get(event.anchor or "", (1, 0))
            add(values, height, event)
        elif isinstance(event, yaml.CollectionStartEvent):
            stack.append([event.anchor, 0, 0])
            if len(stack) - 1 > MAX_DEPTH:
                add(0, 0, event)
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, values, height = stack.pop()
            if anchor:
                anchors[anchor] = (values + 1, height + 1)
            add(values + 1, height + 1, event)


def _short_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML) :] if tag.startswith(_YAML) else tag


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    key = str(key)
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", key):
        return f"{path}.{key}"
    return f"{path}[{key!r}]"


class _Builder:
    """Turns a composed YAML node tree into Python values, recording lines."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: dict[str, int] = {}
        self.problems: list[Diagnostic] = []
        self._constructor = _Loader("")

    def problem(self, node: yaml.Node, path: str, message: str, hint: str | None = None) -> None:
        if node.tag not in self._constructor.yaml_constructors:
            # A tag no safe loader knows: the constructor's own error says so.
            self._constructor.construct_object(node)
        line = node.start_mark.line + 1
        self.problems.append(Diagnostic("error", "yaml", message, self.file, line, path, hint=hint))

    def scalar(self, node: yaml.Node, path: str) -> Any:
        """A scalar's value, if it is one JSON can hold (else a problem and None)."""
        if not isinstance(node, yaml.ScalarNode) or node.tag not in _JSON_SCALARS:
            self.problem(
                node,
                path,
                f"{_short_tag(node.tag)} values are not allowed",
                "graph.yaml holds only strings, numbers, booleans, null, lists and mappings",
            )
            return None
        try:
            value = self._constructor.construct_object(node)
        except (ValueError, TypeError, OverflowError, KeyError, IndexError, yaml.YAMLError):
            shown = node.value if len(node.value) <= 40 else node.value[:40] + "…"
            self.problem(node, path, f"{shown!r} is not a valid {_short_tag(node.tag)} value")
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self.problem(node, path, f"{node.value!r} is not a number JSON can hold")
            return None
        if isinstance(value, str) and "\x00" in value:
            self.problem(node, path, "a string holds a NUL character")
            return None
        return value

    def build(self, node: yaml.Node, path: str) -> Any:
        self.lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            if node.tag != f"{_YAML}map":
                self.problem(node, path, f"{_short_tag(node.tag)} values are not allowed")
                return None
            out: dict[Any, Any] = {}
            self._constructor.flatten_mapping(node)
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    self.problem(key_node, path, "mapping keys must be plain scalars")
                    continue
                key = self.scalar(key_node, path)
                if key is None:
                    if key_node.tag == f"{_YAML}null":
                        self.problem(key_node, path, "mapping keys must be plain scalars")
                    continue
                if isinstance(key, bool):
                    # A key is its text: YAML 1.1 reads `on:` / `yes:` as booleans.
                    key = key_node.value
                key = str(key) if not isinstance(key, str) else key
                child = _child(path, key)
                if key in out:
                    self.problems.append(
                        Diagnostic(
                            "error",
                            "duplicate-key",
                            f"duplicate key '{key}' (first at line {self.lines.get(child)})",
                            self.file,
                            key_node.start_mark.line + 1,
                            child,
                        )
                    )
                    continue
                out[key] = self.build(value_node, child)
                self.lines[child] = key_node.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != f"{_YAML}seq":
                self.problem(node, path, f"{_short_tag(node.tag)} values are not allowed")
                return None
            return [self.build(item, _child(path, i)) for i, item in enumerate(node.value)]
        return self.scalar(node, path)


def parse_yaml(text: str, file: str = "graph.yaml") -> tuple[Any, dict[str, int], list[Diagnostic]]:
    """Parse YAML text into Python values plus a JSON-path -> line map."""
    try:
        _check_limits(text, file)
        node = yaml.compose(text, Loader=_Loader)
        if node is None:
            raise GraphLoadError("the file is empty", where=file)
        builder = _Builder(file)
        data = builder.build(node, "$")
    except yaml.MarkedYAMLError as exc:
        # One line: PyYAML's str() adds the marks on further lines.
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "invalid YAML"
        where = f"{file}:{line}" if line else file
        if "maximum nesting depth" in what:
            # The nesting limit of the LibYAML bundled with newer PyYAML wheels, reached before ours
            # when the parser reads ahead: the same refusal, in our words.
            raise GraphLoadError(
                f"values nest deeper than {MAX_DEPTH} levels", where=where
            ) from None
        raise GraphLoadError(f"malformed YAML: {what}", where=where) from None
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid YAML"
        raise GraphLoadError(f"malformed YAML: {first}", where=file) from None
    return data, builder.lines, builder.problems


def _closest(name: str, choices: list[str]) -> str | None:
    found = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    return found[0] if found else None


def _field_names(cls: type[msgspec.Struct]) -> list[str]:
    """The field names as written in YAML (``as`` for the attribute ``as_``)."""
    return list(cls.__struct_encode_fields__)


_MSGSPEC_AT = re.compile(r"^(?P<msg>.*?)(?: - at `\$(?P<path>[^`]*)`)?$")


def _describe_type_error(message: str) -> tuple[str, str]:
    """Split a msgspec ValidationError message into (text, relative path)."""
    m = _MSGSPEC_AT.match(message)
    assert m is not None
    text = m.group("msg")
    text = text.replace("Expected `", "expected ").replace("`, got `", ", got ").rstrip("`")
    return text, m.group("path") or ""


def _check_fields(
    data: dict[str, Any],
    cls: type[msgspec.Struct],
    path: str,
    lines: dict[str, int],
    file: str,
    node: str | None,
    what: str,
) -> list[Diagnostic]:
    problems: list[Diagnostic] = []
    known = _field_names(cls)
    if issubclass(cls, NodeBase):
        known = [*known, "type"]
    for key in data:
        if key not in known:
            suggestion = _closest(key, known)
            # Loki ignores fields it does not know, so a graph written for a later Loki
            # still runs: a warning (``validate --strict`` makes it an error).
            problems.append(
                Diagnostic(
                    "warning",
                    "unknown-field",
                    f"unknown field '{key}' in {what} (ignored)",
                    file,
                    lines.get(_child(path, key)),
                    _child(path, key),
                    node,
                    f"did you mean '{suggestion}'?" if suggestion else None,
                )
            )
    required = [
        name
        for name, default in zip(
            cls.__struct_encode_fields__,
            (msgspec.NODEFAULT,) * (len(cls.__struct_fields__) - len(cls.__struct_defaults__))
            + tuple(cls.__struct_defaults__),
            strict=True,
        )
        if default is msgspec.NODEFAULT
    ]
    for name in required:
        if name not in data:
            hint = None
            if name == "on_other":
                hint = "free-form answers are always possible; on_other says where they route"
            typo = next(
                (k for k in data if k not in known and _closest(str(k), [name]) == name), None
            )
            if typo is not None:
                hint = f"'{typo}' is written instead: rename it to '{name}'"
            elif name == "on_other" and "next" in data:
                hint = (
                    "an approval routes by its answer (routes, on_other); its `next` is "
                    "ignored: move that target to on_other"
                )
            problems.append(
                Diagnostic(
                    "error",
                    "missing-field",
                    f"{what} is missing the required field '{name}'",
                    file,
                    lines.get(path),
                    path,
                    node,
                    hint,
                )
            )
    return problems


#: msgspec builds a type's converter on its first use, and two threads doing that at
#: once can crash the process (a segmentation fault); a super-step's branches and a
#: worker's slots load graphs concurrently. Loads are cached, so one lock costs nothing.
_CONVERT_LOCK = threading.Lock()


def _convert(
    value: Any, cls: Any, path: str, lines: dict[str, int], file: str, node: str | None
) -> tuple[Any, list[Diagnostic]]:
    try:
        with _CONVERT_LOCK:
            return msgspec.convert(value, cls), []
    except msgspec.ValidationError as exc:
        text, rel = _describe_type_error(str(exc))
        full = path + rel if rel else path
        line = None
        probe = full
        while probe and line is None:
            line = lines.get(probe)
            cut = max(probe.rfind("."), probe.rfind("["))
            probe = probe[:cut] if cut > 0 else ""
        return None, [Diagnostic("error", "type", text, file, line, full, node)]


def _known_only(data: dict[str, Any], cls: type[msgspec.Struct]) -> dict[str, Any]:
    """``data`` without the fields ``cls`` does not have (reported as warnings)."""
    known = set(_field_names(cls))
    if issubclass(cls, NodeBase):
        known.add("type")
    if all(key in known for key in data):
        return data
    return {k: v for k, v in data.items() if k in known}


def _errors(problems: list[Diagnostic]) -> bool:
    return any(p.severity == "error" for p in problems)


def structure(data: Any, lines: dict[str, int], file: str) -> tuple[Graph | None, list[Diagnostic]]:
    """Check the shape of parsed graph.yaml data and build a :class:`Graph`."""
    if not isinstance(data, dict):
        return None, [
            Diagnostic("error", "shape", "graph.yaml must be a mapping of fields", file, 1, "$")
        ]
    problems = _check_fields(data, Graph, "$", lines, file, None, "the graph")
    version = data.get("version")
    if isinstance(version, float | int) and not isinstance(version, bool):
        problems.append(
            Diagnostic(
                "error",
                "version",
                f'version must be the string "1.0", got the number {version}',
                file,
                lines.get("$.version"),
                "$.version",
                hint='quote it: version: "1.0"',
            )
        )
        data = {**data, "version": str(version)}
    nodes = data.get("nodes")
    converted_nodes: dict[str, Any] = {}
    if isinstance(nodes, dict):
        for node_id, node_data in nodes.items():
            npath = _child("$.nodes", node_id)
            if not isinstance(node_data, dict):
                problems.append(
                    Diagnostic(
                        "error",
                        "shape",
                        f"node '{node_id}' must be a mapping of fields",
                        file,
                        lines.get(npath),
                        npath,
                        node_id,
                    )
                )
                continue
            node_type = node_data.get("type")
            cls = NODE_TYPES.get(node_type) if isinstance(node_type, str) else None
            if cls is None:
                if node_type is None:
                    message = f"node '{node_id}' has no 'type'"
                else:
                    message = f"node '{node_id}' has unknown type '{node_type}'"
                suggestion = _closest(str(node_type), list(NODE_TYPES)) if node_type else None
                hint = f"did you mean '{suggestion}'?" if suggestion else None
                problems.append(
                    Diagnostic(
                        "error",
                        "node-type",
                        message,
                        file,
                        lines.get(_child(npath, "type"), lines.get(npath)),
                        _child(npath, "type"),
                        node_id,
                        hint or f"the types are: {', '.join(NODE_TYPES)}",
                    )
                )
                continue
            field_problems = _check_fields(
                node_data, cls, npath, lines, file, node_id, f"{node_type} node '{node_id}'"
            )
            problems.extend(field_problems)
            if _errors(field_problems):
                continue
            value, errs = _convert(_known_only(node_data, cls), cls, npath, lines, file, node_id)
            problems.extend(errs)
            if value is not None:
                converted_nodes[node_id] = value
    elif "nodes" in data:
        problems.append(
            Diagnostic(
                "error",
                "shape",
                "'nodes' must be a mapping of node id to node",
                file,
                lines.get("$.nodes"),
                "$.nodes",
            )
        )
    settings = data.get("settings")
    if isinstance(settings, dict):
        from graphrun.runtime.graph.model import Settings

        settings_problems = _check_fields(
            settings, Settings, "$.settings", lines, file, None, "settings"
        )
        problems.extend(settings_problems)
        settings = _known_only(settings, Settings)
        if not _errors(settings_problems):
            # Typed here too, so a bad setting is reported alongside other errors.
            _value, typed = _convert(settings, Settings, "$.settings", lines, file, None)
            problems.extend(typed)
    if any(p.severity == "error" for p in problems):
        return None, problems
    top = {k: v for k, v in _known_only(data, Graph).items() if k != "nodes"}
    if isinstance(settings, dict):
        top["settings"] = settings
    top["nodes"] = {}
    graph, errs = _convert(top, Graph, "$", lines, file, None)
    problems.extend(errs)
    if graph is None:
        return None, problems
    graph.nodes.update(converted_nodes)
    return graph, problems


def find_graph_file(target: Path) -> Path:
    """graph.yaml of an agent directory, or the file itself."""
    if target.is_dir():
        candidate = target / "graph.yaml"
        if not candidate.exists():
            if (target / "config.yaml").exists():
                raise GraphLoadError(
                    f"{target} is an LLM-loop agent (config.yaml), not a graph agent",
                    hint="graph agents are defined by graph.yaml",
                )
            raise GraphLoadError(f"no graph.yaml in {target}")
        return candidate
    if not target.exists():
        raise GraphLoadError(f"no such file or directory: {target}")
    return target


def load_text(text: str, *, path: Path, agent_dir: Path | None = None) -> LoadedGraph:
    """Parse and structure graph.yaml text; raises GraphLoadError on structural errors.

    The result is cached by (text, path, agent dir): a run's driver, its replay and
    the command that started it parse the same graph once. Callers never mutate it.
    """
    # Absolute, not resolved: a key only has to tell graphs apart (another
    # spelling of the same place parses again), and resolving costs syscalls.
    key = (
        text,
        os.path.abspath(path),
        os.path.abspath(agent_dir if agent_dir is not None else path.parent),
    )
    cached = _LOADED.get(key)
    if cached is not None:
        return cached
    loaded = _load_text(text, path=path, agent_dir=agent_dir)
    if len(_LOADED) >= 64:
        _LOADED.pop(next(iter(_LOADED)))
    _LOADED[key] = loaded
    return loaded


_LOADED: dict[tuple[str, str, str], LoadedGraph] = {}


def _load_text(text: str, *, path: Path, agent_dir: Path | None = None) -> LoadedGraph:
    file = str(path)
    data, lines, problems = parse_yaml(text, file)
    graph, more = structure(data, lines, file)
    problems.extend(more)
    errors = [p for p in problems if p.severity == "error"]
    if errors or graph is None:
        from graphrun.runtime.errors import GraphValidationError

        # Every finding at once: the errors first, then the warnings.
        ordered = sorted(problems, key=lambda d: d.severity != "error")
        raise GraphValidationError(ordered, path=file)
    return LoadedGraph(graph, text, path, agent_dir or path.parent, lines, warnings=problems)


def load_graph(target: str | Path) -> LoadedGraph:
    """Load graph.yaml from an agent directory or a file path."""
    path = find_graph_file(Path(target))
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GraphLoadError(f"cannot read {path}: {exc}") from None
    return load_text(text, path=path, agent_dir=path.parent)


def graph_of(state: RunState) -> LoadedGraph:
    """The graph a run was started with (from its log, not from disk)."""
    path = Path(state.graph_path or "graph.yaml")
    return load_text(
        state.graph_source, path=path, agent_dir=Path(state.agent_dir) if state.agent_dir else None
    )
