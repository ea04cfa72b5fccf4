"""A ``tool`` node's effect: one tool called directly with the node's params, no LLM.

The tool is found as an llm node's ``tools:`` entry would be (an agent's
``tools.py`` / ``tools.sh``, a global tool, or ``mcp:<server>/<tool>``, the MCP
function ``<server>_<tool>``), run through the same runner, and its outcome is
recorded as :class:`~graphrun.eventstore.events.ToolFinished` (a JSON value when the
tool printed one).
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphrun.eventstore.events import ToolFinished


@dataclass(frozen=True)
class ToolTask:
    node_id: str
    visit: int
    tool: str  # as written in graph.yaml
    arguments: str  # the rendered params, canonical JSON (sorted keys)
    timeout: float

    def check_recorded(self, outcome: list[Any]) -> tuple[str, Any, Any, str] | None:
        """How the request made now differs from the recorded one (replay), if it does:
        ``(field, recorded, now, message)``."""
        recorded = next((e for e in outcome if isinstance(e, ToolFinished)), None)
        if recorded is None:
            return None
        if recorded.tool != self.tool:
            return ("tool", recorded.tool, self.tool, "the tool called now differs")
        if recorded.arguments != self.arguments:
            return ("arguments", recorded.arguments, self.arguments, "the tool's params differ")
        return None


def tool_name(entry: str) -> str:
    """The toolbox name of a tool node's ``tool:`` (``mcp:srv/fn`` is ``srv_fn``)."""
    if entry.startswith("mcp:") and "/" in entry:
        server, _, function = entry[4:].partition("/")
        return f"{server}_{function}"
    return entry


class ToolActor:
    """Performs ``tool`` nodes: loads the one tool named, calls it, records the outcome."""

    node_type = "tool"

    def __init__(
        self,
        agent_dir: Path,
        global_tools: list[str],
        mcp_servers: list[str],
        config_dir: Path | None,
        variables: dict[str, str] | None,
        loop: Any = None,
    ) -> None:
        self.agent_dir = agent_dir
        self.loop = loop  # the run's EffectLoop: an MCP tool's session lives there
        self.global_tools = global_tools
        self.mcp_servers = mcp_servers
        self.config_dir = config_dir
        self.variables = variables

    async def run(self, task: ToolTask, ctx: Any) -> None:
        """Load the tool (on the run's executor: it reads files, may wait for an MCP
        server to start) and call it on the run's loop: its process watched from
        there, or its MCP call awaited there."""
        from graphrun.actors.loop import blocking
        from graphrun.actors.tools.toolbox import ToolError, load_toolbox

        started = time.monotonic()
        name = tool_name(task.tool)
        executor = getattr(ctx, "executor", None)
        try:
            box = await blocking(
                ctx,
                functools.partial(
                    load_toolbox,
                    self.agent_dir,
                    [name],
                    global_tools=self.global_tools,
                    mcp_servers=self.mcp_servers,
                    config_dir=self.config_dir,
                    variables=self.variables,
                    timeout=task.timeout,
                    loop=self.loop,
                ),
            )
            result = await box.call_async(
                name, task.arguments, cancel=ctx.cancel, timeout=task.timeout, executor=executor
            )
        except ToolError as exc:
            ctx.record(
                ToolFinished(
                    node_id=task.node_id,
                    visit=task.visit,
                    tool=task.tool,
                    arguments=task.arguments,
                    error=str(exc),
                    duration_ms=round((time.monotonic() - started) * 1000, 3),
                )
            )
            return
        output: Any = result.output
        if not result.is_error:
            try:
                output = json.loads(result.output)
            except ValueError:
                output = result.output.rstrip("\n")
        ctx.record(
            ToolFinished(
                node_id=task.node_id,
                visit=task.visit,
                tool=task.tool,
                arguments=task.arguments,
                output=None if result.is_error else output,
                error=result.output if result.is_error else None,
                duration_ms=round(result.duration_ms, 3),
                source=result.source,
            )
        )


__all__ = ["ToolActor", "ToolTask", "tool_name"]
