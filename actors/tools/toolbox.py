"""The tools an ``llm`` node may call: discovery, whitelists and running them.

A graph's tool universe has three sources, laid out as Loki lays them out:

- **global tools**: the graph's ``global_tools:`` names files in
  ``<config_dir>/functions/tools/``. A ``.py`` file is one tool named after the
  file, implemented by its ``run`` function; a ``.sh`` file is one tool named
  after the file (its ``main``), or one tool per ``# @cmd`` function.
- **agent tools**: ``tools.py`` (every public top-level function is a tool) and
  ``tools.sh`` (argc comment tags, one tool per ``# @cmd`` function) in the
  agent directory.
- **MCP servers** (:mod:`graphrun.actors.tools.mcp`), selected per server with
  ``mcp:<server>`` or per function.

Declarations are read without running anything: Python files with :mod:`ast`
(never imported), Bash files by reading argc's comment tags (``@describe``,
``@cmd``, ``@option``, ``@flag``, ``@env``), which graphrun parses itself.

Tools run as Loki runs them: arguments arrive as JSON, the tool writes its result
to the file named by ``$LLM_OUTPUT`` (graphrun falls back to stdout when that
file stays empty), with Loki's ``LLM_*`` environment, stdin closed, and as
working directory the one graphrun was started in for an agent of a Loki
configuration directory (Loki's: the user's project), else the agent folder
(:func:`graphrun.actors.tools.lokienv.work_dir`). A Bash tool is called as
``bash <file> [<function>] --option value --flag ...``; scripts that end with
``eval "$(argc --argc-eval "$0" "$@")"`` get the variables argc would set from
graphrun (argc need not be installed), and scripts Loki has already built parse
the same command line themselves.
"""

from __future__ import annotations

import ast
import difflib
import functools
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from graphrun.actors import process
from graphrun.actors.base import CancelToken, parse_python
from graphrun.actors.llm.providers.base import ToolResult, ToolSpec
from graphrun.actors.paths import outside_hint, outside_problem
from graphrun.actors.tools.base import DEFAULT_TIMEOUT, ToolError
from graphrun.actors.tools.lokienv import work_dir
from graphrun.eventstore import redaction
from graphrun.eventstore.errors import GraphrunError

if TYPE_CHECKING:
    from graphrun.actors.loop import EffectLoop
    from graphrun.actors.tools.mcp import McpHub

__all__ = [
    "DEFAULT_TIMEOUT",
    "ArgcCommand",
    "ArgcParam",
    "BashTool",
    "PythonTool",
    "Tool",
    "ToolError",
    "Toolbox",
    "discover_tools",
    "load_toolbox",
    "parse_argc",
    "parse_python_tools",
    "validate_whitelist",
]

# What the model gets back when a tool succeeds without writing anything (as Loki).
EMPTY_OUTPUT = "DONE"


class Tool(Protocol):
    """One callable tool: its declaration and how to run it (a tool may also have
    ``async def call_async(arguments, *, cancel, timeout)``, which
    :meth:`Toolbox.call_async` awaits on the run's loop instead)."""

    @property
    def spec(self) -> ToolSpec: ...

    def call(self, arguments: str, *, cancel: CancelToken | None, timeout: float) -> ToolResult:
        """Run the tool with ``arguments`` (a JSON object as text)."""
        ...


# --------------------------------------------------------------------------- #
# tools.py / global .py: declarations from the AST
# --------------------------------------------------------------------------- #

_DOC_SECTIONS = {
    "args",
    "arguments",
    "parameters",
    "params",
    "returns",
    "return",
    "yields",
    "raises",
    "examples",
    "example",
    "note",
    "notes",
    "see also",
    "attributes",
}
_SIMPLE_TYPES = {
    "str": "string",
    "int": "integer",
    "float": "number",
    "bool": "boolean",
    "dict": "object",
    "Dict": "object",
    "Mapping": "object",
}
_LIST_TYPES = {"list", "List", "Sequence", "tuple", "Tuple", "set", "Set", "Iterable"}


@dataclass(frozen=True)
class _PyFunction:
    name: str  # the function to call
    spec: ToolSpec


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and ``Args:`` entries."""
    lines = doc.splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.endswith(":") and stripped[:-1].strip().lower() in _DOC_SECTIONS:
            break
        description.append(lines[i])
        i += 1
    while i < len(lines):
        header = lines[i].strip()[:-1].strip().lower()
        header_indent = len(lines[i]) - len(lines[i].lstrip())
        i += 1
        current: str | None = None
        entry_indent: int | None = None
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            indent = len(line) - len(line.lstrip())
            if stripped and indent <= header_indent:
                break  # the next section
            i += 1
            if header not in ("args", "arguments", "parameters", "params") or not stripped:
                continue
            if entry_indent is None:
                entry_indent = indent
            if indent <= entry_indent and ":" in stripped:
                left, _, text = stripped.partition(":")
                current = left.split("(")[0].strip().lstrip("*")
                args[current] = text.strip()
            elif current is not None:
                args[current] = f"{args[current]} {stripped}".strip()
    return "\n".join(description).strip(), args


def _annotation_schema(node: ast.expr | None) -> tuple[dict[str, Any], bool]:
    """JSON Schema for a type hint, and whether the hint allows ``None``."""
    if node is None:
        return {"type": "string"}, False
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"type": "null"}, True
        if isinstance(node.value, str):  # a quoted ("forward") annotation
            try:
                return _annotation_schema(parse_python(node.value, mode="eval").body)
            except SyntaxError:
                return {"type": "string"}, False
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
        members = _union_members(node)
        return _union_schema(members)
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        if name in _LIST_TYPES:
            return {"type": "array", "items": {"type": "string"}}, False
        return {"type": _SIMPLE_TYPES.get(name, "string")}, False
    if isinstance(node, ast.Subscript):
        base = node.value
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if name == "Optional":
            schema, _ = _annotation_schema(args[0])
            return schema, True
        if name == "Union":
            return _union_schema(args)
        if name == "Literal":
            values = [a.value for a in args if isinstance(a, ast.Constant)]
            schema = {"type": _json_type(values[0]) if values else "string", "enum": values}
            if len({_json_type(v) for v in values}) > 1:
                schema.pop("type")
            return schema, None in values
        if name == "Annotated":
            return _annotation_schema(args[0])
        if name in _LIST_TYPES:
            item, _ = _annotation_schema(args[0])
            return {"type": "array", "items": item}, False
        if name in _SIMPLE_TYPES:
            return {"type": _SIMPLE_TYPES[name]}, False
    return {"type": "string"}, False


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union_members(node.left) + _union_members(node.right)
    return [node]


def _union_schema(members: list[ast.expr]) -> tuple[dict[str, Any], bool]:
    nullable = any(isinstance(m, ast.Constant) and m.value is None for m in members)
    rest = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)]
    schemas = [_annotation_schema(m)[0] for m in rest]
    if len(schemas) == 1:
        return schemas[0], nullable
    return {"anyOf": schemas}, nullable


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def _python_name(name: str) -> str:
    """Loki's tool name for a Python function or file: lower-case, ``[a-z0-9_]``."""
    return "_".join(part for part in re.split(r"[^a-z0-9]+", name.lower()) if part)


def parse_python_tools(path: Path, *, source: str, global_tool: bool = False) -> list[_PyFunction]:
    """Read the tool declarations of a Python tool file without importing it.

    Every public top-level function is a tool (in a global tool file only
    ``run``, named after the file). The description is the docstring without its
    sections; parameters come from the type hints, with descriptions from the
    docstring's ``Args:`` section; a parameter with a default or an optional type
    is not required.

    Raises:
        ToolError: the file cannot be read or parsed, or a tool has no docstring.
    """
    text = _read(path)
    try:
        tree = parse_python(text, filename=str(path))
    except SyntaxError as exc:
        raise ToolError(
            f"cannot parse tool file: {exc.msg}", where=f"{path}:{exc.lineno or 0}"
        ) from None
    functions: list[_PyFunction] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if node.name.startswith("_") or (global_tool and node.name != "run"):
            continue
        name = _python_name(path.stem if global_tool else node.name)
        doc = ast.get_docstring(node) or ""
        description, arg_docs = _split_docstring(doc)
        if not description:
            raise ToolError(
                f"tool function '{node.name}' has no docstring",
                where=f"{path}:{node.lineno}",
                hint="describe the tool in a docstring, or prefix helpers with '_'",
            )
        functions.append(
            _PyFunction(
                node.name,
                ToolSpec(name, description, _python_parameters(node, arg_docs), source),
            )
        )
    if global_tool and not functions:
        raise ToolError(
            "global Python tool has no 'run' function",
            where=str(path),
            hint="define `def run(...)` with a docstring",
        )
    return functions


def _python_parameters(
    node: ast.FunctionDef | ast.AsyncFunctionDef, docs: Mapping[str, str]
) -> dict[str, Any]:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += list(args.defaults)
    pairs = [
        *zip(positional, defaults, strict=True),
        *zip(args.kwonlyargs, args.kw_defaults, strict=True),
    ]
    properties: dict[str, Any] = {}
    required: list[str] = []
    for arg, default in pairs:
        if arg.arg in ("self", "cls"):
            continue
        schema, nullable = _annotation_schema(arg.annotation)
        schema = dict(schema)
        if docs.get(arg.arg):
            schema["description"] = docs[arg.arg]
        properties[arg.arg] = schema
        if default is None and not nullable:
            required.append(arg.arg)
    return _object_schema(properties, required)


def _object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


# --------------------------------------------------------------------------- #
# tools.sh / global .sh: argc comment tags
# --------------------------------------------------------------------------- #

_TAG_RE = re.compile(r"^\s*#\s*@([A-Za-z][\w-]*)(?:\s+(.*?))?\s*$")
_CONTINUATION_RE = re.compile(r"^\s*#\s+([^@\s].*?)\s*$")
_FUNC_RE = re.compile(
    r"^\s*(?:function\s+([^\s(){}=;]+)\s*(?:\(\s*\))?|([^\s(){}=;#$]+)\s*\(\s*\))\s*(?:\{.*)?$"
)
_LONG_RE = re.compile(
    r"^(?P<dashes>--?|\+)(?P<name>[A-Za-z0-9][\w.:-]*?)(?P<mod>[!*+~]?)(?P<sep>,)?"
    r"(?P<value>=.*|\[.*\])?$"
)
_SHORT_RE = re.compile(r"^[-+][A-Za-z0-9]$")
_ENV_RE = re.compile(r"^(?P<name>[A-Za-z_]\w*)(?P<mod>!?)(?P<value>=\S*|\[\S*\])?$")


@dataclass(frozen=True)
class ArgcParam:
    """An ``@option`` or ``@flag`` of an argc-annotated script.

    Attributes:
        name: the id argc derives (long name without dashes, or the short letter).
        cli: the switch as written (``--dry-run``), used on the command line.
        is_flag: an ``@flag`` (a boolean), not an ``@option``.
        required: marked ``!`` or ``+``.
        multiple: marked ``*``, ``+`` or ``~``: an array, the switch repeated.
        choices: the allowed values from ``[a|b]``, if static.
        default: the static default from ``=value`` or ``[=a|b]``.
        notation: the first ``<NOTATION>`` (``INT`` and ``NUM`` make numbers).
        description: the help text.
    """

    name: str
    cli: str
    is_flag: bool = False
    required: bool = False
    multiple: bool = False
    choices: tuple[str, ...] | None = None
    default: str | None = None
    notation: str | None = None
    description: str = ""

    @property
    def key(self) -> str:
        """The JSON property name and the suffix of argc's ``argc_<key>`` variable."""
        return self.name.replace("-", "_")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of this parameter (as Loki derives it)."""
        if self.is_flag:
            schema: dict[str, Any] = {"type": "boolean"}
        elif self.multiple:
            schema = {"type": "array", "items": {"type": "string"}}
        elif self.notation == "INT":
            schema = {"type": "integer"}
        elif self.notation == "NUM":
            schema = {"type": "number"}
        else:
            schema = {"type": "string"}
        if self.description:
            schema["description"] = self.description
        if self.choices:
            target = schema["items"] if self.multiple else schema
            target["enum"] = list(self.choices)
        return schema


@dataclass(frozen=True)
class ArgcEnv:
    """An ``@env`` declaration: a variable the script reads, maybe with a default."""

    name: str
    required: bool = False
    default: str | None = None
    description: str = ""


@dataclass
class ArgcCommand:
    """The root of an argc script or one of its ``@cmd`` functions."""

    describe: str = ""
    function: str | None = None  # None: the root command (its ``main``)
    line: int = 0
    params: list[ArgcParam] = field(default_factory=list)
    envs: list[ArgcEnv] = field(default_factory=list)


def _param_value(value: str | None) -> tuple[tuple[str, ...] | None, str | None]:
    """Choices and default from an argc param-value (``=x``, ``[a|b]``, ``[=a|b]``)."""
    if not value:
        return None, None
    if value.startswith("="):
        default = value[1:]
        return None, None if default.startswith("`") else default.strip("\"'")
    inner = value[1:-1]
    if inner.startswith(("?", "`")):
        return None, None  # choices computed by a function: nothing static to declare
    has_default = inner.startswith("=")
    choices = tuple(c.strip() for c in inner.lstrip("=").split("|"))
    return choices, choices[0] if has_default else None


def _parse_option(text: str, *, is_flag: bool, where: str) -> ArgcParam:
    tokens = text.split()
    if not tokens:
        raise ToolError("empty argc tag", where=where)
    short: str | None = None
    if _SHORT_RE.match(tokens[0]) and len(tokens) > 1 and tokens[1][:1] in "-+":
        short = tokens.pop(0)
    match = _LONG_RE.match(tokens[0])
    if match is None:
        raise ToolError(
            f"cannot read the argc tag '{text}'",
            where=where,
            hint="expected e.g. `# @option --name <VALUE> description`",
        )
    tokens.pop(0)
    mod = match["mod"]
    choices, default = _param_value(match["value"])
    notation: str | None = None
    while tokens and (tokens[0].startswith("$") or tokens[0].startswith("<")):
        token = tokens.pop(0)
        if token.startswith("<") and notation is None:
            notation = token.strip("<>").rstrip("*+?")
    name = match["name"]
    cli = f"{match['dashes']}{name}"
    del short  # the long name is the id; a short alias changes nothing for a tool
    return ArgcParam(
        name=name,
        cli=cli,
        is_flag=is_flag,
        required=mod in ("!", "+"),
        multiple=mod in ("*", "+", "~") and not is_flag,
        choices=choices,
        default=default,
        notation=notation,
        description=" ".join(tokens),
    )


def _parse_env(text: str, *, where: str) -> ArgcEnv:
    name_part, _, description = text.partition(" ")
    match = _ENV_RE.match(name_part)
    if match is None:
        raise ToolError(f"cannot read the argc tag '@env {text}'", where=where)
    _choices, default = _param_value(match["value"])
    return ArgcEnv(match["name"], match["mod"] == "!", default, description.strip())


def parse_argc(text: str, *, path: Path) -> tuple[ArgcCommand, list[ArgcCommand]]:
    """Read argc comment tags: the root command and the ``@cmd`` functions.

    Tags before the first ``@cmd`` belong to the root command (``@describe`` and
    its ``main``); the tags after a ``@cmd`` belong to the function defined next.
    A comment line right after a tag continues that tag's description.
    ``@arg`` positionals are ignored, as Loki ignores them (a model passes
    named arguments only).

    Raises:
        ToolError: a tag cannot be read, or a ``@cmd`` has no function after it.
    """
    root = ArgcCommand()
    commands: list[ArgcCommand] = []
    current = root
    pending: ArgcCommand | None = None
    # Where a continuation line goes: (object, attribute) of the last tag.
    last: tuple[Any, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{number}"
        tag = _TAG_RE.match(line)
        if tag:
            name, rest = tag[1], tag[2] or ""
            last = None
            if name == "describe":
                root.describe = rest
                last = (root, "describe")
            elif name == "cmd":
                pending = ArgcCommand(describe=rest, line=number)
                current = pending
                last = (pending, "describe")
            elif name in ("option", "flag"):
                param = _parse_option(rest, is_flag=name == "flag", where=where)
                current.params.append(param)
                last = (current.params, str(len(current.params) - 1))
            elif name == "env":
                current.envs.append(_parse_env(rest, where=where))
                last = (current.envs, str(len(current.envs) - 1))
            continue
        more = _CONTINUATION_RE.match(line)
        if more and last is not None:
            _append_description(last, more[1])
            continue
        last = None
        func = _FUNC_RE.match(line)
        if func and pending is not None:
            pending.function = func[1] or func[2]
            commands.append(pending)
            pending = None
            current = root
    if pending is not None:
        raise ToolError(
            "`# @cmd` is not followed by a function",
            where=f"{path}:{pending.line}",
            hint="define the function right after its tags: `name() { ... }`",
        )
    return root, commands


def _append_description(target: tuple[Any, str], text: str) -> None:
    owner, attr = target
    if isinstance(owner, list):
        item = owner[int(attr)]
        owner[int(attr)] = replace(item, description=f"{item.description} {text}".strip())
    else:
        setattr(owner, attr, f"{getattr(owner, attr)}\n{text}".strip())


def _argc_tools(path: Path, *, source: str) -> list[tuple[ArgcCommand, ToolSpec]]:
    """The tools of an argc script: one per ``@cmd`` function, else its root."""
    root, commands = parse_argc(_read(path), path=path)
    chosen: list[tuple[ArgcCommand, str]]
    if commands:
        chosen = [
            (c, c.function or "") for c in commands if not (c.function or "_").startswith("_")
        ]
    else:
        chosen = [(root, path.stem)]
    tools: list[tuple[ArgcCommand, ToolSpec]] = []
    for command, name in chosen:
        if not command.describe.strip():
            line = command.line or 1
            raise ToolError(
                f"tool '{name}' has no description",
                where=f"{path}:{line}",
                hint="describe it with `# @describe ...` or `# @cmd <description>`",
            )
        properties = {p.key: p.schema() for p in command.params}
        required = [p.key for p in command.params if p.required]
        spec = ToolSpec(
            name.replace("-", "_"),
            command.describe.strip(),
            _object_schema(properties, required),
            source,
        )
        tools.append((command, spec))
    return tools


# --------------------------------------------------------------------------- #
# Running local tools
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _RunContext:
    """What every local tool process gets: where it runs and Loki's environment."""

    agent_dir: Path
    root_dir: Path
    cache_root: Path
    agent_name: str | None
    python: str
    config_dir: Path | None = None
    # The run's agent variables (name, value); None: the declared defaults.
    variables: tuple[tuple[str, str], ...] | None = None


def _cache_root(config_dir: Path | None) -> Path:
    if config_dir is not None:
        return config_dir / "cache"
    import platformdirs  # only needed when no config dir is known

    return Path(platformdirs.user_cache_dir("graphrun")) / "tools"


def _python_for(agent_dir: Path) -> str:
    # Loki runs Python tools in the agent's own .venv when it has one.
    venv = agent_dir / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else "python3"


def _arguments(arguments: str) -> dict[str, Any] | str:
    """The model's arguments as a dict, or an error message for the model."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return f"the arguments are not valid JSON ({exc}): {arguments[:200]}"
    if not isinstance(value, dict):
        return f"the arguments must be a JSON object, got: {arguments[:200]}"
    return value


def _error(message: str, source: str, started: float) -> ToolResult:
    return ToolResult(message, True, (time.monotonic() - started) * 1000, source)


@dataclass
class _Launch:
    """One tool process to run, and how its outcome becomes the tool's result: made
    by a tool's :meth:`plan` (which blocks: it reads files), run blocking
    (:meth:`run`) or awaited on the run's loop (:meth:`run_async`)."""

    argv: list[str]
    name: str
    source: str
    env: dict[str, str]
    cwd: Path | None
    timeout: float
    started: float
    # After the process, whatever its result: the tool's own check and clean-up.
    after: Callable[[ToolResult], ToolResult] | None = None
    output_path: str = ""

    def prepare(self, cancel: CancelToken | None) -> ToolResult | None:
        """The file the tool writes its result to (``$LLM_OUTPUT``); a cancelled
        call's result instead."""
        if cancel is not None and cancel.cancelled:
            return _error(
                f"tool '{self.name}' was cancelled ({cancel.reason})", self.source, self.started
            )
        fd, self.output_path = tempfile.mkstemp(prefix="graphrun-tool-", suffix=".out")
        os.close(fd)
        self.env = {**self.env, "LLM_OUTPUT": self.output_path}
        return None

    def run(self, cancel: CancelToken | None) -> ToolResult:
        stopped = self.prepare(cancel)
        if stopped is not None:
            return stopped
        try:
            ended: process.Finished | OSError = process.run(
                self.argv, env=self.env, cwd=self.cwd, timeout=self.timeout, cancel=cancel
            )
        except OSError as exc:
            ended = exc
        return self.conclude(ended, cancel)

    async def run_async(self, cancel: CancelToken | None, executor: Any) -> ToolResult:
        import asyncio

        loop = asyncio.get_running_loop()
        stopped = await loop.run_in_executor(executor, self.prepare, cancel)
        if stopped is not None:
            return stopped
        try:
            ended: process.Finished | OSError = await process.run_async(
                self.argv, env=self.env, cwd=self.cwd, timeout=self.timeout, cancel=cancel
            )
        except OSError as exc:
            ended = exc
        return await loop.run_in_executor(executor, self.conclude, ended, cancel)

    def conclude(self, ended: process.Finished | OSError, cancel: CancelToken | None) -> ToolResult:
        """The result: from ``$LLM_OUTPUT`` or stdout, or why there is none."""
        result = self._result(ended, cancel)
        return self.after(result) if self.after is not None else result

    def _result(self, ended: process.Finished | OSError, cancel: CancelToken | None) -> ToolResult:
        name, source, started = self.name, self.source, self.started
        try:
            if isinstance(ended, OSError):
                return _error(f"tool '{name}' could not start: {ended}", source, started)
            out_text = Path(self.output_path).read_text(encoding="utf-8", errors="replace")
        finally:
            Path(self.output_path).unlink(missing_ok=True)
        stdout_text = ended.stdout.decode("utf-8", errors="replace")
        stderr_text = ended.stderr.decode("utf-8", errors="replace").strip()
        if ended.timed_out:
            return _error(
                f"tool '{name}' timed out after {self.timeout:g} s and was killed", source, started
            )
        if cancel is not None and cancel.cancelled:
            return _error(f"tool '{name}' was cancelled ({cancel.reason})", source, started)
        if ended.returncode != 0:
            detail = stderr_text or out_text.strip() or stdout_text.strip()
            message = f"tool '{name}' exited with code {ended.returncode}"
            return _error(f"{message}: {detail}" if detail else message, source, started)
        text = out_text if out_text.strip() else stdout_text
        if not text.strip():
            text = EMPTY_OUTPUT
        return ToolResult(text, False, (time.monotonic() - started) * 1000, source)


def _raw_json(arguments: Mapping[str, Any]) -> dict[str, str]:
    """The arguments as Loki's wrappers export them (tools read them with ``jq``)."""
    raw = json.dumps(arguments, ensure_ascii=False)
    return {"LLM_TOOL_RAW_JSON": raw, "LLM_AGENT_RAW_JSON": raw}


def _named_keys(path: Path) -> list[str]:
    """The key variables a tool file names: it evidently needs those."""
    from graphrun.actors.secrets import key_names

    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [name for name in key_names() if name in text]


def _tool_env(
    ctx: _RunContext, tool_name: str, agent_func: str | None, *, needs: Sequence[str] = ()
) -> dict[str, str]:
    """Loki's environment for a tool process; key variables only if the tool
    declares them (``needs``)."""
    from graphrun.actors.secrets import child_env
    from graphrun.actors.tools.lokienv import loki_env

    env = loki_env(
        dict(os.environ),
        agent_dir=ctx.agent_dir,
        config_dir=ctx.config_dir,
        root_dir=ctx.root_dir,
        variables=None if ctx.variables is None else dict(ctx.variables),
    )
    env = child_env(needs, base=env)
    env.update(
        LLM_ROOT_DIR=str(ctx.root_dir),
        LLM_TOOL_NAME=tool_name,
        LLM_TOOL_CACHE_DIR=str(ctx.cache_root / tool_name),
    )
    if ctx.agent_name is not None:
        env.update(
            LLM_AGENT_NAME=ctx.agent_name,
            LLM_AGENT_ROOT_DIR=str(ctx.agent_dir),
            LLM_AGENT_CACHE_DIR=str(ctx.cache_root / ctx.agent_name),
        )
        if agent_func is not None:
            env["LLM_AGENT_FUNC"] = agent_func
    return env


# Runs one function of a Python tool file: imports it by path, calls the function
# with the JSON arguments as keyword arguments and writes what it returns.
_PY_RUNNER = """\
import importlib.util, json, os, sys
path, func, raw = sys.argv[1:4]
sys.path.insert(0, os.path.dirname(path))
spec = importlib.util.spec_from_file_location(
    os.path.splitext(os.path.basename(path))[0], path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
value = getattr(module, func)(**json.loads(raw))
if value is not None:
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False, default=str)
    with open(os.environ["LLM_OUTPUT"], "a", encoding="utf-8") as out:
        out.write(value)
"""


@dataclass(frozen=True)
class PythonTool:
    """A function of a ``tools.py`` or a global ``.py`` tool, run in ``python3``."""

    spec: ToolSpec
    path: Path
    function: str
    ctx: _RunContext
    agent_tool: bool

    def call(self, arguments: str, *, cancel: CancelToken | None, timeout: float) -> ToolResult:
        planned = self.plan(arguments, timeout=timeout)
        return planned if isinstance(planned, ToolResult) else planned.run(cancel)

    def plan(self, arguments: str, *, timeout: float) -> _Launch | ToolResult:
        """The process a call runs (or the model's error instead); it reads files."""
        started = time.monotonic()
        parsed = _arguments(arguments)
        if isinstance(parsed, str):
            return _error(f"tool '{self.spec.name}': {parsed}", self.spec.source, started)
        argv = [self.ctx.python, "-c", _PY_RUNNER, str(self.path), self.function]
        argv.append(json.dumps(parsed))
        env = _tool_env(
            self.ctx,
            self.spec.name,
            self.function if self.agent_tool else None,
            needs=_named_keys(self.path),
        )
        env.update(_raw_json(parsed))
        return _Launch(
            argv,
            name=self.spec.name,
            source=self.spec.source,
            env=env,
            cwd=work_dir(self.ctx.agent_dir),
            timeout=timeout,
            started=started,
        )


def _shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"


def _cli_value(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


# Stands in for `argc --argc-eval` in scripts that were not built by Loki: prints the
# variable assignments and the function call graphrun prepared for this call.
_ARGC_SHIM = (
    '() { if [ "$1" = --argc-eval ]; then printf "%s\\n" "$GRAPHRUN_ARGC_EVAL"; '
    'else echo "argc: only --argc-eval is available under graphrun" >&2; return 1; fi; }'
)


# Runs a tool script that has no argc dispatch of its own (Loki's tools never have
# one: Loki builds it in). The script is sourced with its own path as $0 and the
# command line as "$@"; a script that ends with argc's eval line runs its function
# there, any other gets the function called afterwards.
_ARGC_DISPATCH = (
    '. "$0"\nif [ -e "$GRAPHRUN_ARGC_MARK" ]; then exit "$?"; fi\neval "$GRAPHRUN_ARGC_EVAL"\n'
)


def _argc_built(path: Path) -> bool:
    """Whether ``argc --argc-build`` made this script (it then parses its arguments)."""
    try:
        return "# ARGC-BUILD {" in path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


@dataclass(frozen=True)
class BashTool:
    """The root command or a ``@cmd`` function of an argc-annotated script."""

    spec: ToolSpec
    path: Path
    command: ArgcCommand
    ctx: _RunContext
    agent_tool: bool

    def bind(self, arguments: Mapping[str, Any]) -> tuple[list[str], str] | str:
        """The command-line switches and argc's eval text for these arguments.

        Returns an error message for the model instead when an argument is
        unknown, a required one is missing, or a value is not one of the choices.
        """
        params = {p.key: p for p in self.command.params}
        unknown = [k for k in arguments if k not in params]
        if unknown:
            known = ", ".join(params) or "none"
            return f"unknown argument(s) {', '.join(unknown)} (known: {known})"
        cli: list[str] = []
        assignments: list[str] = []
        for key, param in params.items():
            value = arguments.get(key)
            if value is None:
                if param.required:
                    return f"missing required argument '{key}'"
                if param.default is not None:
                    assignments.append(f"argc_{key}={_shell_quote(param.default)}")
                continue
            if param.is_flag:
                if value:
                    cli.append(param.cli)
                    assignments.append(f"argc_{key}=1")
                continue
            values = value if isinstance(value, list) else [value]
            texts = [_cli_value(v) for v in values]
            if param.choices:
                bad = [t for t in texts if t not in param.choices]
                if bad:
                    return (
                        f"argument '{key}' must be one of {', '.join(param.choices)}, got {bad[0]}"
                    )
            if param.required and not texts:
                return f"missing required argument '{key}'"
            for text in texts:
                cli += [param.cli, text]
            if param.multiple:
                assignments.append(f"argc_{key}=( {' '.join(map(_shell_quote, texts))} )")
            elif texts:
                assignments.append(f"argc_{key}={_shell_quote(texts[-1])}")
        for env in self.command.envs:
            if env.default is not None:
                assignments.append(
                    f'[ -n "${{{env.name}+x}}" ] || export {env.name}={_shell_quote(env.default)}'
                )
            elif env.required:
                assignments.append(
                    f'[ -n "${{{env.name}+x}}" ] || {{ echo "error: the environment variable '
                    f'{env.name} is required" >&2; exit 1; }}'
                )
        function = self.command.function or "main"
        assignments += [f"argc__fn={_shell_quote(function)}", function]
        return cli, "\n".join(assignments)

    def call(self, arguments: str, *, cancel: CancelToken | None, timeout: float) -> ToolResult:
        planned = self.plan(arguments, timeout=timeout)
        return planned if isinstance(planned, ToolResult) else planned.run(cancel)

    def plan(self, arguments: str, *, timeout: float) -> _Launch | ToolResult:
        """The process a call runs (or the model's error instead); it reads files."""
        started = time.monotonic()
        parsed = _arguments(arguments)
        if isinstance(parsed, str):
            return _error(f"tool '{self.spec.name}': {parsed}", self.spec.source, started)
        bound = self.bind(parsed)
        if isinstance(bound, str):
            return _error(f"tool '{self.spec.name}': {bound}", self.spec.source, started)
        cli, eval_text = bound
        built = _argc_built(self.path)
        # A script argc has built parses its own command line; any other script is
        # sourced by a dispatcher that then calls the function, as Loki's build does.
        argv = ["bash", str(self.path)] if built else ["bash", "-c", _ARGC_DISPATCH, str(self.path)]
        if self.command.function is not None:
            argv.append(self.command.function)
        env = _tool_env(
            self.ctx,
            self.spec.name,
            self.command.function if self.agent_tool else None,
            needs=[e.name for e in self.command.envs] + _named_keys(self.path),
        )
        function = self.command.function or "main"
        fd, mark = tempfile.mkstemp(prefix="graphrun-argc-", suffix=".called")
        os.close(fd)
        os.unlink(mark)  # the dispatch creates it right before calling the function
        env["GRAPHRUN_ARGC_MARK"] = mark
        env.update(_raw_json(parsed))
        env["GRAPHRUN_ARGC_EVAL"] = f'printf "" > "$GRAPHRUN_ARGC_MARK"\n{eval_text}'
        env["BASH_FUNC_argc%%"] = _ARGC_SHIM

        def after(result: ToolResult) -> ToolResult:
            # Whether the dispatch reached the function (it made the mark just before).
            called = os.path.exists(mark)
            Path(mark).unlink(missing_ok=True)
            if not built and not result.is_error and not called:
                return _error(
                    f"tool '{self.spec.name}': {self.path.name} ended without calling its "
                    f"function '{function}' (does the script exit before its end?)",
                    self.spec.source,
                    started,
                )
            return result

        return _Launch(
            argv + cli,
            name=self.spec.name,
            source=self.spec.source,
            env=env,
            cwd=work_dir(self.ctx.agent_dir),
            timeout=timeout,
            started=started,
            after=after,
        )


class Toolbox:
    """The tools one ``llm`` node may call, by name.

    ``call`` never raises for what the model got wrong (an unknown tool, bad
    arguments, a failing tool): the model gets an error result it can react to.
    """

    def __init__(self, tools: Sequence[Tool] = (), *, timeout: float = DEFAULT_TIMEOUT):
        self._tools = {tool.spec.name: tool for tool in tools}
        self.timeout = timeout
        #: The declarations to send to the model, in whitelist order.
        self.specs: list[ToolSpec] = [tool.spec for tool in self._tools.values()]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def call(
        self,
        name: str,
        arguments: str,
        *,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
    ) -> ToolResult:
        """Run the tool ``name`` with ``arguments`` (a JSON object as text)."""
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "none"
            return ToolResult(f"unknown tool '{name}' (available: {available})", True, 0.0, "")
        result = tool.call(arguments, cancel=cancel, timeout=timeout or self.timeout)
        return _redacted(result)

    async def call_async(
        self,
        name: str,
        arguments: str,
        *,
        cancel: CancelToken | None = None,
        timeout: float | None = None,
        executor: Any = None,
    ) -> ToolResult:
        """:meth:`call` awaited on the run's loop: a tool that can be awaited (an MCP
        server's, ``call_async``) is awaited there; a tool that runs a process has
        it watched from the loop (what it reads and writes around it goes to
        ``executor``); any other is called on ``executor``."""
        import asyncio

        tool = self._tools.get(name)
        awaitable = getattr(tool, "call_async", None)
        if awaitable is not None:
            result: ToolResult = await awaitable(
                arguments, cancel=cancel, timeout=timeout or self.timeout
            )
            return _redacted(result)
        loop = asyncio.get_running_loop()
        plan = getattr(tool, "plan", None)
        if tool is None or plan is None:
            return await loop.run_in_executor(
                executor,
                functools.partial(self.call, name, arguments, cancel=cancel, timeout=timeout),
            )
        planned = await loop.run_in_executor(
            executor, functools.partial(plan, arguments, timeout=timeout or self.timeout)
        )
        if not isinstance(planned, ToolResult):
            planned = await planned.run_async(cancel, executor)
        return _redacted(planned)


def _redacted(result: ToolResult) -> ToolResult:
    output = redaction.redact(result.output)  # a key a tool found goes nowhere
    return result if output is result.output else replace(result, output=output)


# --------------------------------------------------------------------------- #
# Discovery and whitelists
# --------------------------------------------------------------------------- #


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError("tool file not found", where=str(path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(f"cannot read tool file: {exc}", where=str(path)) from None


def _context(agent_dir: Path, config_dir: Path | None, *, agent: bool) -> _RunContext:
    if agent:
        root = config_dir if config_dir is not None else agent_dir
    else:
        # Loki's run-tool gives a global tool that an agent uses the agent's folder as
        # its root: LLM_ROOT_DIR, and the .env loaded first (then the config dir's).
        root = agent_dir.resolve()
    return _RunContext(
        agent_dir=agent_dir,
        root_dir=root,
        cache_root=_cache_root(config_dir),
        agent_name=agent_dir.name,
        python=_python_for(agent_dir),
        config_dir=config_dir,
    )


def _file_tools(path: Path, source: str, ctx: _RunContext, *, agent: bool) -> list[Tool]:
    suffix = path.suffix.lower()
    if suffix == ".py":
        return [
            PythonTool(f.spec, path, f.name, ctx, agent)
            for f in parse_python_tools(path, source=source, global_tool=not agent)
        ]
    if suffix == ".sh":
        return [
            BashTool(spec, path, cmd, ctx, agent) for cmd, spec in _argc_tools(path, source=source)
        ]
    raise ToolError(
        f"unsupported tool file type '{path.suffix}'",
        where=str(path),
        hint="tools are .sh (argc comments) or .py files",
    )


def _local_tools(
    agent_dir: Path, *, global_tools: Sequence[str], config_dir: Path | None
) -> dict[str, Tool]:
    found: dict[str, Tool] = {}

    def add(tools: list[Tool]) -> None:
        for tool in tools:
            other = found.get(tool.spec.name)
            if other is not None:
                raise ToolError(
                    f"tool '{tool.spec.name}' is defined twice: in {other.spec.source} "
                    f"and in {tool.spec.source}",
                    hint="rename one of them",
                )
            found[tool.spec.name] = tool

    agent_dir = agent_dir.resolve()
    if global_tools:
        if config_dir is None:
            raise ToolError(
                f"global tools {', '.join(global_tools)} need a config directory",
                hint="they are looked up in <config_dir>/functions/tools/",
            )
        tools_dir = config_dir / "functions" / "tools"
        ctx = _context(agent_dir, config_dir, agent=False)
        for file_name in global_tools:
            path = tools_dir / file_name
            outside = outside_problem(
                tools_dir, file_name, what=f"global tool '{file_name}'", place=str(tools_dir)
            )
            if outside is not None:
                raise ToolError(outside, hint=outside_hint())
            if not path.is_file():
                raise ToolError(
                    f"global tool '{file_name}' not found in {tools_dir}",
                    hint="global_tools entries are file names such as get_time.py or search.sh",
                )
            add(_file_tools(path, f"global:{file_name}", ctx, agent=False))
    ctx = _context(agent_dir, config_dir, agent=True)
    for file_name in ("tools.sh", "tools.py"):
        path = agent_dir / file_name
        if path.is_file():
            outside = outside_problem(agent_dir, file_name, what=f"the agent's {file_name}")
            if outside is not None:  # a symlink out of the folder
                raise ToolError(outside, hint=outside_hint())
            add(_file_tools(path, file_name, ctx, agent=True))
    return found


def discover_tools(
    agent_dir: Path, *, global_tools: Sequence[str] = (), config_dir: Path | None = None
) -> dict[str, ToolSpec]:
    """Every global and agent tool available to the agent, by name (MCP excluded).

    Raises:
        ToolError: a tool file is missing or unreadable, or two sources declare
            the same tool name.
    """
    tools = _local_tools(agent_dir, global_tools=global_tools, config_dir=config_dir)
    return {name: tool.spec for name, tool in tools.items()}


def _suggest(entry: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(entry, list(known), n=1, cutoff=0.6)
    if close:
        return f"did you mean '{close[0]}'?"
    if known:
        return f"known: {', '.join(sorted(known))}"
    return "the agent has no tools"


def _resolve(
    agent_dir: Path,
    whitelist: Sequence[str],
    *,
    global_tools: Sequence[str],
    mcp_servers: Sequence[str],
    config_dir: Path | None,
    hub: McpHub | None,
    start_mcp: bool,
    loop: EffectLoop | None = None,
) -> tuple[list[Tool], list[str]]:
    """The tools a whitelist selects, and an error message per bad entry.

    An agent of a Loki configuration directory sees each ``mcp:<server>`` entry as
    Loki offers it: the server's three meta-functions (``mcp_search_``,
    ``mcp_describe_``, ``mcp_invoke_<server>``), which Loki's prompts name; any
    other agent gets the server's own tools (``<server>_<tool>``)."""
    try:
        local = _local_tools(agent_dir, global_tools=global_tools, config_dir=config_dir)
    except ToolError as exc:
        return [], [str(exc)]
    if work_dir(agent_dir) is None:  # a Loki-layout agent (see lokienv.work_dir)
        from graphrun.actors.tools.mcp import META_PREFIXES

        whitelist = [
            name
            for entry in whitelist
            for name in (
                [f"{prefix}_{entry[4:]}" for prefix in META_PREFIXES]
                if entry.startswith("mcp:") and entry[4:] in mcp_servers
                else [entry]
            )
        ]
    selected: dict[str, Tool] = {}
    errors: list[str] = []
    mcp_tools: dict[str, list[Tool]] | None = None  # server -> tools, listed on demand

    def get_hub() -> McpHub:
        nonlocal hub
        if hub is None:
            from graphrun.actors.tools.mcp import default_hub

            hub = default_hub(config_dir, loop=loop)
        return hub

    def server_tools(server: str) -> list[Tool]:
        return list(get_hub().tools(server))

    def configured() -> Mapping[str, object]:
        if hub is not None:
            return hub.servers
        from graphrun.actors.tools.mcp import load_mcp_config

        return load_mcp_config(config_dir)

    def select(tool: Tool) -> None:
        clash = local.get(tool.spec.name)
        if clash is not None and clash is not tool:
            errors.append(
                f"tool '{tool.spec.name}' is defined twice: in {clash.spec.source} "
                f"and in {tool.spec.source} (rename one of them)"
            )
            return
        taken = selected.get(tool.spec.name)
        if taken is not None and taken is not tool:
            errors.append(
                f"tool '{tool.spec.name}' is offered twice: by {taken.spec.source} "
                f"and by {tool.spec.source} (select only one of them)"
            )
            return
        selected[tool.spec.name] = tool

    from graphrun.actors.tools.mcp import meta_server

    if start_mcp and mcp_servers:
        # Start every server this whitelist lists tools of at once, not one by one.
        wanted = [e[4:] for e in whitelist if e.startswith("mcp:") and e[4:] in mcp_servers]
        wanted += [m for m in (meta_server(e, mcp_servers) for e in whitelist) if m]
        if any(
            not e.startswith("mcp:") and e not in local and not meta_server(e, mcp_servers)
            for e in whitelist
        ):
            wanted += list(mcp_servers)
        if len(set(wanted)) > 1:
            try:
                get_hub().start(wanted)
            except GraphrunError:
                pass  # each server's own error is reported below
    for entry in whitelist:
        meta = meta_server(entry, mcp_servers) if entry not in local else None
        if meta is not None:
            # Loki's mcp_search_/mcp_describe_/mcp_invoke_<server>: nothing starts yet.
            try:
                configured()[meta]  # a missing server raises KeyError
                if start_mcp:
                    from graphrun.actors.tools.mcp import meta_tools

                    get_hub().tools(meta)  # started with the agent, as Loki does
                    select(meta_tools(get_hub(), meta)[entry])
            except KeyError:
                errors.append(f"MCP server '{meta}' is not configured in mcp.json")
            except GraphrunError as exc:
                errors.append(str(exc))
            continue
        if entry.startswith("mcp:"):
            server = entry[4:]
            if server not in mcp_servers:
                hint = _suggest(server, mcp_servers) if mcp_servers else "mcp_servers is empty"
                errors.append(f"unknown MCP server '{server}' in tools entry '{entry}' ({hint})")
                continue
            try:
                if start_mcp:
                    for tool in server_tools(server):
                        select(tool)
                else:
                    configured()[server]  # a missing server raises KeyError
            except KeyError:
                errors.append(f"MCP server '{server}' is not configured in mcp.json")
            except GraphrunError as exc:
                errors.append(str(exc))
            continue
        if entry in local:
            select(local[entry])
            continue
        if mcp_servers and start_mcp:
            if mcp_tools is None:
                mcp_tools = {}
                for server in mcp_servers:
                    try:
                        mcp_tools[server] = server_tools(server)
                    except GraphrunError as exc:
                        errors.append(str(exc))
            matches = [
                tool
                for tools in mcp_tools.values()
                for tool in tools
                if entry in (tool.spec.name, getattr(tool, "remote_name", None))
            ]
            if len(matches) == 1:
                select(matches[0])
                continue
            if len(matches) > 1:
                where = ", ".join(f"{t.spec.source} as '{t.spec.name}'" for t in matches)
                errors.append(
                    f"tool '{entry}' is ambiguous: it is offered by {where} (name the one you mean)"
                )
                continue
            known = list(local) + [t.spec.name for ts in mcp_tools.values() for t in ts]
        elif mcp_servers:
            continue  # may be an MCP function: checked when the servers are started
        else:
            known = list(local)
        errors.append(f"unknown tool '{entry}' in the tools whitelist ({_suggest(entry, known)})")
    return list(selected.values()), errors


def validate_whitelist(
    agent_dir: Path,
    whitelist: Sequence[str],
    *,
    global_tools: Sequence[str] = (),
    mcp_servers: Sequence[str] = (),
    config_dir: Path | None = None,
    hub: McpHub | None = None,
    start_mcp: bool = False,
) -> list[str]:
    """Check an ``llm`` node's ``tools:`` entries; one message per problem.

    Global and agent tools are checked by reading their files (nothing runs).
    ``mcp:<server>`` entries are checked against ``mcp_servers`` and mcp.json.
    An entry that is not a local tool may be a single MCP function: checking it
    needs the servers' tool lists, so with ``start_mcp=False`` (the default)
    such entries are left to :func:`load_toolbox`; with ``start_mcp=True`` the
    servers are started (lazily, through ``hub``) and the entry is checked now.
    """
    _tools, errors = _resolve(
        agent_dir,
        whitelist,
        global_tools=global_tools,
        mcp_servers=mcp_servers,
        config_dir=config_dir,
        hub=hub,
        start_mcp=start_mcp,
    )
    return errors


def load_toolbox(
    agent_dir: Path,
    whitelist: Sequence[str],
    *,
    global_tools: Sequence[str] = (),
    mcp_servers: Sequence[str] = (),
    config_dir: Path | None = None,
    hub: McpHub | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    variables: Mapping[str, str] | None = None,
    loop: EffectLoop | None = None,
) -> Toolbox:
    """The :class:`Toolbox` for an ``llm`` node's ``tools:`` whitelist.

    Entries are exact tool names (global, agent, or MCP functions, either as
    exposed, ``<server>_<tool>``, or as the server names them) or
    ``mcp:<server>`` for all of a server's tools. MCP servers start on first use
    through ``hub`` (default: the hub kept on ``loop``, the run's event loop, where
    their calls are then awaited; without a loop, the process-wide hub for
    ``config_dir``). Call it off that loop's thread (it waits for the servers).

    Raises:
        ToolError: an entry names no known tool (with the closest name), a name
            is ambiguous or defined twice, or an MCP server fails to start.
    """
    if not whitelist:
        return Toolbox(timeout=timeout)
    tools, errors = _resolve(
        agent_dir,
        whitelist,
        global_tools=global_tools,
        mcp_servers=mcp_servers,
        config_dir=config_dir,
        hub=hub,
        start_mcp=True,
        loop=loop,
    )
    if errors:
        raise ToolError("; ".join(dict.fromkeys(errors)))
    if variables is not None:  # the run's values, as recorded when it began
        pairs = tuple(sorted(variables.items()))
        tools = [
            replace(t, ctx=replace(t.ctx, variables=pairs))
            if isinstance(t, PythonTool | BashTool)
            else t
            for t in tools
        ]
    return Toolbox(tools, timeout=timeout)
