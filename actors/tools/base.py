"""What every source of tools shares: the default time limit and the error a tool
source raises (the agent's files in :mod:`~graphrun.actors.tools.toolbox`, the MCP
servers in :mod:`~graphrun.actors.tools.mcp`)."""

from __future__ import annotations

from graphrun.eventstore.errors import GraphrunError

DEFAULT_TIMEOUT = 60.0
"""Seconds a tool may run before its process group is killed."""


class ToolError(GraphrunError):
    """A tool file that cannot be read, or a whitelist that names unknown tools."""


__all__ = ["DEFAULT_TIMEOUT", "ToolError"]
