"""MCP servers as a tool source.

Servers are configured in ``<config_dir>/functions/mcp.json``, in the Claude
Desktop shape Loki reads::

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "server-files"],
                  "env": {"TOKEN": "{{FILES_TOKEN}}"}, "cwd": "/srv"},
        "search": {"url": "https://example.test/mcp", "headers": {...}}
    }}

``type`` is ``stdio`` (a ``command`` run as a child process), ``http`` (streamable
HTTP at ``url``) or ``sse`` (the older HTTP+SSE transport at ``url``); without a
``type``, a ``command`` means stdio and a ``url`` streamable HTTP. ``env`` values
may be strings, booleans or numbers (as Loki allows; they reach the server as
text). ``{{NAME}}`` in any string is replaced by the environment variable ``NAME``
when the server starts. A stdio server gets the environment without the key
variables (:mod:`graphrun.actors.secrets`) except those its entry names (``{{NAME}}``
or ``$NAME``), plus its ``env``.

Servers a toolbox needs are started in parallel.

The official ``mcp`` SDK is asyncio-based. An :class:`McpHub` holds one session
per server, each owned by one task on one event loop (anyio's scopes must be
entered and left in the same task): a server starts on first use, and its session
is reused by every call made through the hub. A run's hub is bound to the run's
:class:`~graphrun.actors.loop.EffectLoop` (``default_hub(config_dir, loop=...)``:
one hub per configuration directory and loop, so a worker starts each server once
for every run it drives): its sessions live on that loop, an llm node's tool loop
or a ``tool`` node awaits a call there (``call_async``: no thread, no other loop),
and the hub ends its sessions and their processes when that loop stops. A hub made
outside any run (checking a graph, tests) runs a loop thread of its own.
Synchronous callers off the loop (building a toolbox on the run's executor) submit
to the hub's loop and wait; on the loop's own thread they are refused (they would
wait for themselves). :meth:`McpHub.close` (also run at exit) ends the sessions
and their processes.

Loki offers each server to the model as three meta-functions instead of its
tools: ``mcp_search_<server>`` (find tools by keywords), ``mcp_describe_<server>``
(one tool's input schema) and ``mcp_invoke_<server>`` (call a tool by name). An
LLM-loop agent (Loki's config.yaml) gets those; any graph may name them in an llm
node's ``tools:`` (:class:`McpMetaTool`).

Otherwise each MCP tool is offered to the model as ``<server>_<tool>``, with every
character outside ``[A-Za-z0-9_-]`` replaced by ``_`` and names longer than 64
characters cut to 55 plus ``_`` and 8 hex digits of a hash (OpenAI's limit on
tool names is ``^[a-zA-Z0-9_-]{1,64}$``). Its source is ``mcp:<server>``.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from graphrun.actors import process
from graphrun.actors.base import CancelToken
from graphrun.actors.llm.providers.base import ToolResult, ToolSpec
from graphrun.actors.tools.base import DEFAULT_TIMEOUT, ToolError

if TYPE_CHECKING:
    from graphrun.actors.loop import EffectLoop

__all__ = [
    "META_PREFIXES",
    "McpError",
    "McpHub",
    "McpMetaTool",
    "McpServerConfig",
    "McpTool",
    "default_hub",
    "load_mcp_config",
    "mcp_tool_name",
    "meta_server",
    "meta_tools",
]

START_TIMEOUT = 30.0
"""Seconds a server may take to start and answer ``initialize``."""

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_DOLLAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_TRANSPORTS = ("stdio", "http", "sse")


class McpError(ToolError):
    """An MCP server that is misconfigured, cannot start, or broke its session."""


@dataclass(frozen=True)
class McpServerConfig:
    """One entry of mcp.json: a stdio ``command`` or a streamable-HTTP ``url``."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    transport: str = "stdio"  # "stdio", "http" (streamable HTTP) or "sse"

    def needs(self) -> list[str]:
        """The environment variables the entry names (``{{NAME}}`` or ``$NAME``)."""
        texts = [self.command or "", *self.args, *self.env.values(), self.cwd or ""]
        names = [m[1] for t in texts for m in _PLACEHOLDER.finditer(t)]
        names += [m[1] or m[2] for t in texts for m in _DOLLAR.finditer(t)]
        return names

    def describe(self) -> str:
        """The command line or URL, for error messages."""
        if self.url is not None:
            return self.url
        return " ".join([self.command or "", *self.args])


def _config_path(config_dir: Path | None) -> Path | None:
    return None if config_dir is None else config_dir / "functions" / "mcp.json"


def load_mcp_config(config_dir: Path | None) -> dict[str, McpServerConfig]:
    """The servers of ``<config_dir>/functions/mcp.json`` (none if it is absent).

    Raises:
        McpError: the file is not valid JSON or an entry has the wrong shape.
    """
    path = _config_path(config_dir)
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise McpError(f"cannot read MCP configuration: {exc}", where=str(path)) from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise McpError(
            "MCP configuration has no 'mcpServers' object",
            where=str(path),
            hint='expected {"mcpServers": {"name": {"command": ..., "args": [...]}}}',
        )
    return {name: _server_config(name, entry, path) for name, entry in servers.items()}


def _server_config(name: str, entry: object, path: Path) -> McpServerConfig:
    where = f"{path} ($.mcpServers.{name})"
    if not isinstance(entry, dict):
        raise McpError("an MCP server entry must be an object", where=where)
    command, url = entry.get("command"), entry.get("url")
    kind = entry.get("type")
    if kind is not None and kind not in _TRANSPORTS:
        raise McpError(
            f"unknown MCP server type {json.dumps(kind)}",
            where=where,
            hint="'type' is one of stdio, http, sse",
        )
    if kind is None:
        if (command is None) == (url is None):
            raise McpError(
                "an MCP server needs exactly one of 'command' (stdio) or 'url' (HTTP)",
                where=where,
            )
        kind = "stdio" if command is not None else "http"
    if kind == "stdio" and (command is None or url is not None):
        raise McpError("a stdio MCP server needs 'command' and no 'url'", where=where)
    if kind != "stdio" and (url is None or command is not None):
        raise McpError(f"an MCP server of type '{kind}' needs 'url' and no 'command'", where=where)
    args, env, headers = entry.get("args", []), entry.get("env", {}), entry.get("headers", {})
    cwd = entry.get("cwd")
    ok = (
        isinstance(command or url, str)
        and isinstance(args, list)
        and all(isinstance(a, str) for a in args)
        and isinstance(env, dict)
        and isinstance(headers, dict)
        and all(isinstance(v, str | bool | int | float) for v in env.values())
        and all(isinstance(v, str) for v in headers.values())
        and (cwd is None or isinstance(cwd, str))
    )
    if not ok:
        raise McpError(
            "bad MCP server entry: 'command'/'url'/'cwd' are strings, 'args' a list of "
            "strings, 'env' an object of strings, booleans or numbers, 'headers' an "
            "object of strings",
            where=where,
        )
    env_text = {k: _env_text(v) for k, v in env.items()}
    return McpServerConfig(
        name, command, tuple(args), env_text, cwd, url, dict(headers), transport=kind
    )


def _env_text(value: str | bool | int | float) -> str:
    """An ``env`` value as the server sees it (Loki: ``true``, ``42``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _resolve(text: str, server: str, environ: Mapping[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in environ:
            raise McpError(
                f"MCP server '{server}' uses {{{{{name}}}}} but the environment variable "
                f"{name} is not set",
                hint=f"export {name}=... before running",
            )
        return environ[name]

    return _PLACEHOLDER.sub(value, text)


def _resolved(config: McpServerConfig, environ: Mapping[str, str]) -> McpServerConfig:
    """The config with every ``{{NAME}}`` replaced from ``environ``."""

    def sub(text: str) -> str:
        return _resolve(text, config.name, environ)

    return McpServerConfig(
        config.name,
        None if config.command is None else sub(config.command),
        tuple(sub(a) for a in config.args),
        {k: sub(v) for k, v in config.env.items()},
        None if config.cwd is None else sub(config.cwd),
        None if config.url is None else sub(config.url),
        {k: sub(v) for k, v in config.headers.items()},
        transport=config.transport,
    )


def mcp_tool_name(server: str, tool: str) -> str:
    """The name an MCP tool is offered under: ``<server>_<tool>``, sanitised."""
    raw = f"{server}_{tool}"
    name = _BAD_NAME_CHARS.sub("_", raw)
    if len(name) > 64:
        name = f"{name[:55]}_{hashlib.sha256(raw.encode()).hexdigest()[:8]}"
    return name


def _sdk() -> Any:
    try:
        import mcp
    except ImportError:
        raise McpError(
            "MCP servers need the 'mcp' package, which is not installed",
            hint="install graphrun[mcp]",
        ) from None
    return mcp


def _leaf(exc: BaseException) -> BaseException:
    """The first real error inside (nested) exception groups from anyio."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _content_text(result: Any) -> str:
    """The text of a CallToolResult: text parts joined, other parts summarised."""
    parts: list[str] = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource":
            resource = item.resource
            text = getattr(resource, "text", None)
            parts.append(text if text is not None else f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
        else:
            mime = getattr(item, "mime_type", None) or getattr(item, "mimeType", "")
            parts.append(f"[{kind} {mime}]".replace(" ]", "]"))
    if not parts:
        structured = getattr(result, "structured_content", None)
        if structured is None:
            structured = getattr(result, "structuredContent", None)
        if structured is not None:
            return json.dumps(structured, ensure_ascii=False)
    return "\n".join(parts)


@dataclass(frozen=True)
class McpTool:
    """One function of an MCP server, callable through its hub."""

    spec: ToolSpec
    remote_name: str
    server: str
    hub: McpHub = field(repr=False, compare=False)

    def _arguments(self, arguments: str, started: float) -> dict[str, Any] | ToolResult:
        """The parsed arguments, or the error result the model gets for them."""
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            parsed = f"the arguments are not valid JSON ({exc})"
        if isinstance(parsed, dict):
            return parsed
        message = parsed if isinstance(parsed, str) else "the arguments must be a JSON object"
        return ToolResult(
            f"tool '{self.spec.name}': {message}",
            True,
            (time.monotonic() - started) * 1000,
            self.spec.source,
        )

    def call(self, arguments: str, *, cancel: CancelToken | None, timeout: float) -> ToolResult:
        """Call the tool with ``arguments`` (a JSON object as text)."""
        started = time.monotonic()
        parsed = self._arguments(arguments, started)
        if isinstance(parsed, ToolResult):
            return parsed
        text, is_error = self.hub.call_tool(
            self.server, self.remote_name, parsed, cancel=cancel, timeout=timeout
        )
        return ToolResult(text, is_error, (time.monotonic() - started) * 1000, self.spec.source)

    async def call_async(
        self, arguments: str, *, cancel: CancelToken | None, timeout: float
    ) -> ToolResult:
        """:meth:`call` awaited on the running loop (the run's: no thread, no hop)."""
        started = time.monotonic()
        parsed = self._arguments(arguments, started)
        if isinstance(parsed, ToolResult):
            return parsed
        text, is_error = await self.hub.call_tool_async(
            self.server, self.remote_name, parsed, cancel=cancel, timeout=timeout
        )
        return ToolResult(text, is_error, (time.monotonic() - started) * 1000, self.spec.source)


@dataclass
class _Server:
    """A running (or starting) server: its session and how to stop it."""

    ready: asyncio.Future[Any]
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None
    errlog: IO[str] | None = None


class McpHub:
    """The MCP sessions of a run's event loop (``loop``), or of a loop thread of the
    hub's own (no ``loop``: a hub made outside any run)."""

    def __init__(
        self,
        servers: Mapping[str, McpServerConfig],
        *,
        environ: Mapping[str, str] | None = None,
        start_timeout: float = START_TIMEOUT,
        loop: EffectLoop | None = None,
    ):
        self.servers: Mapping[str, McpServerConfig] = dict(servers)
        self._environ = environ
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._effects = loop  # the run's loop the sessions live on, if bound to one
        self._loop: asyncio.AbstractEventLoop | None = None if loop is None else loop.loop
        self._thread: threading.Thread | None = None
        self._running: dict[str, _Server] = {}  # touched only on the loop's thread
        self._tools: dict[str, list[McpTool]] = {}
        self._closed = False
        self._at_exit = False

    @classmethod
    def from_config_dir(cls, config_dir: Path | None, **kwargs: Any) -> McpHub:
        """A hub for the servers of ``<config_dir>/functions/mcp.json``."""
        return cls(load_mcp_config(config_dir), **kwargs)

    # -- the loop --------------------------------------------------------- #

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the sessions live on (the hub's own thread starts on first use)."""
        with self._lock:
            if self._closed:
                raise McpError("the MCP hub is closed")
            if self._effects is not None and self._effects.stopped:
                raise McpError("the MCP hub's event loop has stopped")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_run_unpinned, args=(loop,), name="graphrun-mcp", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            if not self._at_exit:  # no server process outlives graphrun
                atexit.register(self.close)
                self._at_exit = True
            return self._loop

    def _on_own_loop(self) -> bool:
        """Whether the caller runs on the thread of the loop the sessions live on."""
        if self._effects is not None:
            return self._effects.on_loop()
        return self._thread is not None and threading.get_ident() == self._thread.ident

    def _run(self, coro: Any, *, timeout: float | None, cancel: CancelToken | None = None) -> Any:
        """``coro`` run on the hub's loop from another thread, waited for."""
        try:
            loop = self._ensure_loop()
            if self._on_own_loop():
                raise McpError(
                    "an MCP server was waited for on the event loop its session lives on "
                    "(it would wait for itself)",
                    hint="await the tool's call_async there",
                )
        except McpError:
            coro.close()  # never started: say so, rather than warn it was never awaited
            raise
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        remove = cancel.on_cancel(future.cancel) if cancel is not None else (lambda: None)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise
        finally:
            remove()

    async def _await(self, coro: Any) -> Any:
        """``coro`` awaited on the hub's loop: in place when that is the running loop
        (a run's hub on its run's loop), else submitted there (a hub of its own)."""
        try:
            loop = self._ensure_loop()
        except McpError:
            coro.close()
            raise
        if loop is asyncio.get_running_loop():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))

    # -- sessions --------------------------------------------------------- #

    def _config(self, server: str) -> McpServerConfig:
        config = self.servers.get(server)
        if config is None:
            known = ", ".join(sorted(self.servers)) or "none"
            raise McpError(
                f"MCP server '{server}' is not configured in mcp.json", hint=f"configured: {known}"
            )
        return _resolved(config, os.environ if self._environ is None else self._environ)

    async def _session(self, server: str) -> Any:
        entry = self._running.get(server)
        if entry is None:
            config = self._config(server)
            loop = asyncio.get_running_loop()
            entry = _Server(ready=loop.create_future(), stop=asyncio.Event())
            # Closed by _serve when the session ends; read back if the server fails.
            entry.errlog = tempfile.TemporaryFile(  # noqa: SIM115
                "w+", encoding="utf-8", errors="replace"
            )
            self._running[server] = entry
            entry.task = loop.create_task(self._serve(config, entry))
        try:
            return await asyncio.wait_for(asyncio.shield(entry.ready), self._start_timeout)
        except TimeoutError:
            entry.stop.set()
            raise McpError(
                f"MCP server '{server}' did not answer within {self._start_timeout:g} s "
                f"(command: {self.servers[server].describe()}){self._stderr_tail(entry)}"
            ) from None

    async def _serve(self, config: McpServerConfig, entry: _Server) -> None:
        """Own one session from start to stop (anyio scopes must stay in one task)."""
        mcp = _sdk()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if config.transport == "sse":
                    from mcp.client.sse import sse_client

                    assert config.url is not None
                    streams = await stack.enter_async_context(
                        sse_client(config.url, headers=dict(config.headers) or None)
                    )
                elif config.url is not None:
                    streams = await stack.enter_async_context(
                        _http_streams(config.url, dict(config.headers))
                    )
                else:
                    assert config.command is not None
                    from graphrun.actors.secrets import child_env

                    base = os.environ if self._environ is None else self._environ
                    needs = self.servers[config.name].needs()
                    params = mcp.StdioServerParameters(
                        command=config.command,
                        args=list(config.args),
                        # Marked like every child, so that it dies with graphrun.
                        env={
                            **child_env(needs, base=base),
                            **config.env,
                            process.OWNER_ENV: process.owner_mark(),
                        },
                        cwd=config.cwd,
                    )
                    streams = await stack.enter_async_context(
                        mcp.stdio_client(params, errlog=entry.errlog)
                    )
                session = await stack.enter_async_context(mcp.ClientSession(streams[0], streams[1]))
                await session.initialize()
                entry.ready.set_result(session)
                try:
                    await entry.stop.wait()
                except asyncio.CancelledError:
                    # Cancelled with the tasks of its loop (a run's loop stopping):
                    # the session still ends the ordinary way, which stops the
                    # server's process instead of abandoning it.
                    task = asyncio.current_task()
                    if task is not None:
                        task.uncancel()
        except BaseException as exc:
            if not entry.ready.done():
                error = McpError(
                    f"MCP server '{config.name}' failed to start "
                    f"(command: {config.describe()}): {_leaf(exc)}{self._stderr_tail(entry)}"
                )
                entry.ready.set_exception(error)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            if self._running.get(config.name) is entry:
                del self._running[config.name]  # a later call starts it afresh
                self._tools.pop(config.name, None)
            if entry.errlog is not None:
                entry.errlog.close()

    @staticmethod
    def _stderr_tail(entry: _Server) -> str:
        if entry.errlog is None or entry.errlog.closed:
            return ""
        try:
            entry.errlog.flush()
            entry.errlog.seek(0)
            text = entry.errlog.read().strip()
        except (OSError, ValueError):
            return ""
        text = " ".join(text.split())  # one line: it ends up in a one-line error
        return f"; stderr: {text[-500:]}" if text else ""

    async def _list_tools(self, server: str) -> list[Any]:
        session = await self._session(server)
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            if cursor is None:
                result = await session.list_tools()
            else:
                from mcp.types import PaginatedRequestParams

                result = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
            tools.extend(result.tools)
            cursor = getattr(result, "next_cursor", None) or getattr(result, "nextCursor", None)
            if not cursor:
                return tools

    async def _call(self, server: str, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        session = await self._session(server)
        result = await session.call_tool(name, arguments)
        is_error = getattr(result, "is_error", None)
        if is_error is None:
            is_error = getattr(result, "isError", False)
        return _content_text(result), bool(is_error)

    async def _list_many(self, servers: list[str]) -> list[Any]:
        return await asyncio.gather(
            *(self._list_tools(server) for server in servers), return_exceptions=True
        )

    def _tool_objects(self, server: str, listed: list[Any]) -> list[McpTool]:
        """The tools a server listed, as offered (kept for the session's life)."""
        tools: list[McpTool] = []
        seen: set[str] = set()
        for tool in listed:
            name = mcp_tool_name(server, tool.name)
            if name in seen:  # two names that sanitise alike stay apart
                digest = hashlib.sha256(tool.name.encode()).hexdigest()[:8]
                name = f"{name[:55]}_{digest}"
            seen.add(name)
            schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
            description = tool.description or getattr(tool, "title", None) or tool.name
            spec = ToolSpec(
                name,
                description,
                dict(schema or {"type": "object", "properties": {}}),
                f"mcp:{server}",
            )
            tools.append(McpTool(spec, tool.name, server, self))
        self._tools[server] = tools
        return tools

    @staticmethod
    def _list_error(server: str, exc: BaseException) -> McpError:
        if isinstance(exc, McpError):
            return exc
        if isinstance(exc, TimeoutError):
            return McpError(f"MCP server '{server}' did not list its tools in time")
        return McpError(f"MCP server '{server}' failed to list its tools: {_leaf(exc)}")

    # -- the synchronous API (off the hub's loop) -------------------------- #

    def start(self, servers: list[str]) -> None:
        """Start ``servers`` (those not listed yet) in parallel and list their tools.

        Never raises: a server that fails is reported again by :meth:`tools`.
        """
        todo = [s for s in dict.fromkeys(servers) if s not in self._tools and s in self.servers]
        if len(todo) < 2:
            return  # nothing to overlap
        try:
            self._run(self._list_many(todo), timeout=self._start_timeout + 30)
        except Exception:
            return
        for server in todo:  # build the tool objects from the sessions now open
            with contextlib.suppress(McpError):
                self.tools(server)

    def tools(self, server: str) -> list[McpTool]:
        """The server's tools (starting it if needed; listed once per session).

        Raises:
            McpError: the server is not configured, its config names an unset
                variable, or it fails to start.
        """
        cached = self._tools.get(server)
        if cached is not None:
            return cached
        self._config(server)  # fail fast, before starting a thread
        try:
            listed = self._run(self._list_tools(server), timeout=self._start_timeout + 30)
        except Exception as exc:
            raise self._list_error(server, exc) from None
        return self._tool_objects(server, listed)

    def call_tool(
        self,
        server: str,
        name: str,
        arguments: dict[str, Any],
        *,
        cancel: CancelToken | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> tuple[str, bool]:
        """Call ``name`` on ``server``; returns (text, is_error), never raises for the call."""
        if cancel is not None and cancel.cancelled:
            return self._cancelled_before(name, cancel)
        try:
            return self._run(self._call(server, name, arguments), timeout=timeout, cancel=cancel)
        except concurrent.futures.CancelledError:
            return self._cancelled(server, name, cancel)
        except TimeoutError:
            return self._timed_out(server, name, timeout)
        except Exception as exc:
            return self._failed(server, name, exc)

    @staticmethod
    def _cancelled_before(name: str, cancel: CancelToken) -> tuple[str, bool]:
        return f"tool '{name}' was cancelled ({cancel.reason})", True

    @staticmethod
    def _cancelled(server: str, name: str, cancel: CancelToken | None) -> tuple[str, bool]:
        reason = cancel.reason if cancel is not None else "cancelled"
        return f"tool '{name}' on MCP server '{server}' was cancelled ({reason})", True

    @staticmethod
    def _timed_out(server: str, name: str, timeout: float) -> tuple[str, bool]:
        return f"tool '{name}' on MCP server '{server}' timed out after {timeout:g} s", True

    @staticmethod
    def _failed(server: str, name: str, exc: BaseException) -> tuple[str, bool]:
        return f"tool '{name}' on MCP server '{server}' failed: {_leaf(exc)}", True

    # -- the asynchronous API (awaited on a loop) --------------------------- #

    async def tools_async(self, server: str) -> list[McpTool]:
        """:meth:`tools`, awaited (on the hub's own loop: in place).

        Raises:
            McpError: as :meth:`tools`.
        """
        cached = self._tools.get(server)
        if cached is not None:
            return cached
        self._config(server)
        try:
            async with asyncio.timeout(self._start_timeout + 30):
                listed = await self._await(self._list_tools(server))
        except Exception as exc:
            raise self._list_error(server, exc) from None
        return self._tool_objects(server, listed)

    async def call_tool_async(
        self,
        server: str,
        name: str,
        arguments: dict[str, Any],
        *,
        cancel: CancelToken | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> tuple[str, bool]:
        """:meth:`call_tool`, awaited: on the hub's own loop the call is a task of
        that loop (no thread waits for it). ``timeout`` and ``cancel`` end the call,
        not the session; the results are :meth:`call_tool`'s."""
        if cancel is not None and cancel.cancelled:
            return self._cancelled_before(name, cancel)
        loop = asyncio.get_running_loop()
        call = loop.create_task(self._await(self._call(server, name, arguments)))

        def cancelled() -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nothing runs
                loop.call_soon_threadsafe(call.cancel)

        remove = cancel.on_cancel(cancelled) if cancel is not None else (lambda: None)
        try:
            async with asyncio.timeout(timeout):
                result: tuple[str, bool] = await call
                return result
        except TimeoutError:
            return self._timed_out(server, name, timeout)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the awaiting effect itself is cancelled: so is the call
            return self._cancelled(server, name, cancel)
        except Exception as exc:
            return self._failed(server, name, exc)
        finally:
            remove()
            call.cancel()  # (a no-op once it has ended)

    # -- closing ------------------------------------------------------------ #

    async def _shutdown(self) -> None:
        """End every session (on the hub's loop): each task stops its server."""
        entries = list(self._running.values())
        for entry in entries:
            entry.stop.set()
        tasks = [e.task for e in entries if e.task is not None]
        if tasks:
            # The SDK closes stdin, then terminates, then kills: bounded.
            await asyncio.wait(tasks, timeout=8)

    def _mark_closed(self) -> bool:
        """Close the hub to new calls; whether it was open."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._tools.clear()
        atexit.unregister(self.close)
        return True

    async def aclose(self) -> None:
        """:meth:`close`, awaited on the hub's loop (a run's loop stopping)."""
        if self._mark_closed():
            await self._shutdown()

    def close(self) -> None:
        """End every session and server process (and the hub's own loop thread, if
        it has one). Idempotent."""
        if not self._mark_closed():
            return
        loop, thread = self._loop, self._thread
        if loop is None or loop.is_closed() or not loop.is_running():
            return  # nothing was started, or the loop is gone with its sessions
        if self._on_own_loop():
            loop.create_task(self._shutdown())  # cannot wait for itself: under way
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(20)
        if thread is None:
            return  # the run's loop: it goes on serving the run
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()

    def __enter__(self) -> McpHub:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextlib.asynccontextmanager
async def _http_streams(url: str, headers: dict[str, str]) -> AsyncIterator[tuple[Any, Any]]:
    """Read/write streams to a streamable-HTTP server, across SDK versions."""
    from mcp.client import streamable_http as transport

    modern = getattr(transport, "streamable_http_client", None)
    if modern is None:  # mcp < 1.20
        old_client = transport.streamablehttp_client  # type: ignore[attr-defined]
        async with old_client(url, headers=headers or None) as streams:
            yield streams[0], streams[1]
        return
    async with contextlib.AsyncExitStack() as stack:
        client = None
        if headers:
            import httpx

            # What the SDK's own default client uses, plus the headers.
            client = await stack.enter_async_context(
                httpx.AsyncClient(
                    headers=headers,
                    follow_redirects=True,
                    timeout=httpx.Timeout(30.0, read=300.0),
                )
            )
        streams = await stack.enter_async_context(modern(url, http_client=client))
        yield streams[0], streams[1]


#: Loki's meta-function name prefixes, followed by ``_<server>``.
META_PREFIXES = ("mcp_search", "mcp_describe", "mcp_invoke")
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    # snake_case and camelCase names split into their words
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text).replace("_", " ").replace("-", " ")
    return _WORD.findall(spaced.lower())


def _meta_specs(server: str) -> dict[str, ToolSpec]:
    source = f"mcp:{server}"
    describe = f"mcp_describe_{server}"
    return {
        "search": ToolSpec(
            f"mcp_search_{server}",
            f"Find candidate tools by keywords for the {server} MCP server. Returns small "
            f"suggestions; fetch schemas with {describe}.",
            {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "Generalized explanation of what you want to do",
                    },
                    "top_k": {
                        "type": "integer",
                        "description": "How many results to return, between 1 and 20",
                        "default": 8,
                    },
                },
                "required": ["query"],
            },
            source,
        ),
        "describe": ToolSpec(
            describe,
            "Get the full JSON schema for exactly one MCP tool.",
            {
                "type": "object",
                "properties": {
                    "tool": {
                        "type": "string",
                        "description": "The name of the tool; e.g., search_issues",
                    }
                },
                "required": ["tool"],
            },
            source,
        ),
        "invoke": ToolSpec(
            f"mcp_invoke_{server}",
            f"Invoke the specified tool on the {server} MCP server. Always call {describe} "
            "first to find the correct invocation schema for the given tool.",
            {
                "type": "object",
                "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}},
                "required": ["tool"],
            },
            source,
        ),
    }


@dataclass(frozen=True)
class McpMetaTool:
    """One of Loki's three meta-functions of a server (search, describe, invoke)."""

    spec: ToolSpec
    kind: str  # "search", "describe" or "invoke"
    server: str
    hub: McpHub = field(repr=False, compare=False)

    def _done(self, started: float, text: str, is_error: bool = False) -> ToolResult:
        return ToolResult(text, is_error, (time.monotonic() - started) * 1000, self.spec.source)

    def _request(
        self, arguments: str, started: float
    ) -> tuple[dict[str, Any], dict[str, Any]] | ToolResult:
        """The parsed arguments and, for ``invoke``, the tool's own; or the error
        result the model gets for them."""
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            text = f"tool '{self.spec.name}': the arguments are not valid JSON ({exc})"
            return self._done(started, text, True)
        if not isinstance(parsed, dict):
            text = f"tool '{self.spec.name}': the arguments must be a JSON object"
            return self._done(started, text, True)
        name = parsed.get("tool")
        if self.kind != "search" and not isinstance(name, str):
            text = f"tool '{self.spec.name}': 'tool' (a tool name) is required"
            return self._done(started, text, True)
        if self.kind != "invoke":
            return parsed, {}
        arguments_value = parsed.get("arguments") or {}
        if isinstance(arguments_value, str):  # some models send the object as text
            try:
                arguments_value = json.loads(arguments_value)
            except ValueError:
                pass
        if not isinstance(arguments_value, dict):
            return self._done(
                started, f"tool '{self.spec.name}': 'arguments' must be an object", True
            )
        return parsed, arguments_value

    def _answer(self, started: float, tools: list[McpTool], parsed: dict[str, Any]) -> ToolResult:
        """What ``search`` or ``describe`` answers from the server's tools."""
        name = parsed.get("tool")
        if self.kind == "describe":
            found = next((t for t in tools if name in (t.remote_name, t.spec.name)), None)
            if found is None:
                known = ", ".join(t.remote_name for t in tools)
                text = f"{name} not found in {self.server} MCP server catalog (tools: {known})"
                return self._done(started, text, True)
            schema = {
                "type": "object",
                "properties": {"tool": {"type": "string"}, "arguments": found.spec.parameters},
            }
            return self._done(started, json.dumps(schema, ensure_ascii=False))
        found_tools = _search(tools, str(parsed.get("query") or ""), parsed.get("top_k"))
        return self._done(started, json.dumps(found_tools))

    def call(self, arguments: str, *, cancel: CancelToken | None, timeout: float) -> ToolResult:
        """Run the meta-function with ``arguments`` (a JSON object as text)."""
        started = time.monotonic()
        request = self._request(arguments, started)
        if isinstance(request, ToolResult):
            return request
        parsed, invoke_arguments = request
        if self.kind == "invoke":
            text, is_error = self.hub.call_tool(
                self.server, str(parsed["tool"]), invoke_arguments, cancel=cancel, timeout=timeout
            )
            return self._done(started, text, is_error)
        try:
            tools = self.hub.tools(self.server)
        except McpError as exc:
            return self._done(started, f"tool '{self.spec.name}': {exc}", True)
        return self._answer(started, tools, parsed)

    async def call_async(
        self, arguments: str, *, cancel: CancelToken | None, timeout: float
    ) -> ToolResult:
        """:meth:`call` awaited on the running loop (the run's: no thread, no hop)."""
        started = time.monotonic()
        request = self._request(arguments, started)
        if isinstance(request, ToolResult):
            return request
        parsed, invoke_arguments = request
        if self.kind == "invoke":
            text, is_error = await self.hub.call_tool_async(
                self.server, str(parsed["tool"]), invoke_arguments, cancel=cancel, timeout=timeout
            )
            return self._done(started, text, is_error)
        try:
            tools = await self.hub.tools_async(self.server)
        except McpError as exc:
            return self._done(started, f"tool '{self.spec.name}': {exc}", True)
        return self._answer(started, tools, parsed)


def _search(tools: list[McpTool], query: str, top_k: object) -> list[dict[str, str]]:
    """The tools best matching ``query`` (BM25 over names and descriptions, as Loki)."""
    limit = top_k if isinstance(top_k, int) and not isinstance(top_k, bool) else 8
    limit = max(1, min(limit, 20))
    if not tools:
        return []
    from rank_bm25 import BM25Okapi  # type: ignore[import-untyped]

    corpus = [_words(f"{t.remote_name} {t.spec.description}") or ["_"] for t in tools]
    scores = BM25Okapi(corpus).get_scores(_words(query)) if _words(query) else [0.0] * len(tools)
    ranked = sorted(range(len(tools)), key=lambda i: (-scores[i], i))
    hits = [i for i in ranked if scores[i] > 0] or ranked  # nothing matched: show some
    return [
        {
            "name": tools[i].remote_name,
            "server": tools[i].server,
            "description": tools[i].spec.description,
        }
        for i in hits[:limit]
    ]


def meta_tools(hub: McpHub, server: str) -> dict[str, McpMetaTool]:
    """The three meta-functions of ``server``, by name (nothing is started)."""
    return {
        spec.name: McpMetaTool(spec, kind, server, hub)
        for kind, spec in _meta_specs(server).items()
    }


def meta_server(name: str, servers: Sequence[str]) -> str | None:
    """The server a meta-function name such as ``mcp_invoke_<server>`` is about, if any."""
    for prefix in META_PREFIXES:
        if name.startswith(prefix + "_") and name[len(prefix) + 1 :] in servers:
            return name[len(prefix) + 1 :]
    return None


_HUBS: dict[Path | None, McpHub] = {}
_HUBS_LOCK = threading.Lock()


class _LoopHubs:
    """The hubs kept for one run's loop, by configuration directory: made on first
    use, closed (their servers stopped) when the loop stops."""

    def __init__(self, loop: EffectLoop) -> None:
        self.loop = loop
        self.hubs: dict[Path | None, McpHub] = {}
        self.lock = threading.Lock()

    def get(self, key: Path | None, config_dir: Path | None) -> McpHub:
        with self.lock:
            hub = self.hubs.get(key)
            if hub is None or hub._closed:
                hub = self.hubs[key] = McpHub.from_config_dir(config_dir, loop=self.loop)
            return hub

    async def close(self) -> None:
        """Close every hub on the loop (:meth:`EffectLoop.stop` awaits it)."""
        with self.lock:
            hubs = list(self.hubs.values())
        await asyncio.gather(*(hub.aclose() for hub in hubs), return_exceptions=True)


def default_hub(config_dir: Path | None, *, loop: EffectLoop | None = None) -> McpHub:
    """The hub for ``config_dir``'s mcp.json: with ``loop`` (a run's
    :class:`~graphrun.actors.loop.EffectLoop`), the one kept on that loop, whose
    sessions live there and end when it stops; without, the process-wide one, with
    a loop thread of its own (closed at exit).

    Raises:
        McpError: mcp.json cannot be read, or ``loop`` has stopped.
    """
    key = None if config_dir is None else config_dir.resolve()
    if loop is not None:
        if loop.stopped:
            raise McpError("the run's event loop has stopped: no MCP server can start on it")
        return loop.keep(_LOOP_HUBS, lambda: _LoopHubs(loop)).get(key, config_dir)
    with _HUBS_LOCK:
        hub = _HUBS.get(key)
        if hub is None or hub._closed:
            hub = _HUBS[key] = McpHub.from_config_dir(config_dir)
        return hub


_LOOP_HUBS = "graphrun.mcp.hubs"  # the key of a loop's hubs in EffectLoop.keep


def _run_unpinned(loop: Any) -> None:
    """The MCP event loop thread."""
    loop.run_forever()
