"""Loki's built-in functions, offered to an ``llm`` node next to its own tools.

``agent__*`` (sub-agents as child runs), ``user__*`` (questions to a person, as
recorded human input), ``todo__*`` (a todo list kept in the run's log) and
``skill__*`` (skill documents from the configuration directory). An LLM-loop agent
gets them as Loki gives them (``can_spawn_agents``, ``auto_continue``,
``skills_enabled`` …, see :mod:`graphrun.runtime.graph.builtins`); a graph's
``llm`` node gets the ones its ``tools:`` list names.

Every call is recorded like any tool call (``ToolCalled``), so a resumed visit
serves the ones that finished from the log; what a call does besides answering
(a child run started, a question asked) is recorded before it is done, which is
how a resumed run re-attaches instead of repeating it.
"""

from __future__ import annotations

from graphrun.actors.tools.builtin_specs import builtin_specs, is_builtin
from graphrun.runtime.nodes.builtins.toolbox import BuiltinToolbox

__all__ = ["BuiltinToolbox", "builtin_specs", "is_builtin"]
