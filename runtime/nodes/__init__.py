"""Actors for the node types whose effects need the run's configuration: llm, rag, agent.

Each is a small class with ``perform(task, ctx)``; :func:`node_actor` builds it with
what it needs from the run's ports (clients, the agent directory, recorded responses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphrun.runtime.errors import GraphrunError

if TYPE_CHECKING:
    from graphrun.runtime.engine.ports import RunPorts


class LlmActor:
    """The ``llm`` node actor: one call (with retries and a bounded tool loop) per visit."""

    node_type = "llm"

    def __init__(self, ports: RunPorts) -> None:
        from graphrun.actors.llm.client import ClientFactory
        from graphrun.actors.llm.config import load_llm_config

        options = ports.options
        config = load_llm_config(options.config_dir)
        if options.llm_replay is not None:
            self.clients = ClientFactory.replay(options.llm_replay, config)
        else:
            self.clients = ClientFactory(config)
        self.graph = ports.graph
        self.config_dir = options.config_dir
        self.agent_dir = ports.agent_dir
        self.variables = options.variables  # the run's, given to its tools
        self._toolboxes: dict[tuple[str, ...], Any] = {}

    def toolbox(self, whitelist: tuple[str, ...]) -> Any:
        if not whitelist:
            return None
        box = self._toolboxes.get(whitelist)
        if box is None:
            from graphrun.actors.tools.toolbox import load_toolbox

            box = self._toolboxes[whitelist] = load_toolbox(
                self.agent_dir,
                list(whitelist),
                global_tools=list(self.graph.global_tools),
                mcp_servers=list(self.graph.mcp_servers),
                config_dir=self.config_dir,
                variables=self.variables,
            )
        return box

    def close(self) -> None:
        """Release the HTTP connection pools when the actor stops."""
        self.clients.close()

    def inline(self, task: Any) -> bool:
        """Whether a visit can be served on the supervisor's thread: every response
        comes from the recording and there are no tools to run (no I/O, no wait)."""
        return self.clients.replaying and not task.tools

    def perform(self, task: Any, ctx: Any) -> Any:
        # Errors raised here (a replay miss, a tool that cannot load) fail the run; the
        # supervisor prefixes the node id, so they carry none of their own.
        from graphrun.actors.llm.call import perform_llm

        return perform_llm(task, ctx, client_factory=self.clients, toolbox=self.toolbox(task.tools))


def node_actor(node_type: str, ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    if node_type == "llm":
        return LlmActor, (ports,)
    if node_type == "rag":
        from graphrun.runtime.nodes.rag import RagActor

        return RagActor, (ports,)
    if node_type == "agent":
        from graphrun.runtime.nodes.agent import AgentActor

        return AgentActor, (ports,)
    raise GraphrunError(f"node type '{node_type}' has no actor")
