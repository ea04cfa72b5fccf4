"""``skill__*``: Loki's skill documents (``<skills dir>/<name>/SKILL.md``).

The skills directory is ``$COYOTE_SKILLS_DIR`` (or ``$LOKI_SKILLS_DIR``), else
``skills/`` of the configuration directory; a project's own ``.coyote/skills``
(or ``.loki/skills``) in the working directory comes first, as in Loki. A skill's
YAML front matter gives its ``description``; the rest is its body.

As in Loki, a loaded skill's body goes into the system prompt of the turns that
follow, after the node's own (a blank line between), in the order loaded, and
what its front matter grants (``enabled_tools``, ``enabled_mcp_servers``) is
offered from then on;
``skill__unload`` takes both away again. Both are recorded with the call
(``ToolCalled``'s ``instructions`` and ``tools``): a resumed visit rebuilds its
loaded skills from the log, and a replay compares each body with the document of
today.
"""

from __future__ import annotations

import json
from typing import Any

from graphrun.eventstore.events import ToolCalled
from graphrun.runtime.graph.skills import (
    auto_unloads,
    available,
    find_skill,
    read_grants,
    read_skill,
    skills_dirs,
)

__all__ = ["Skills", "available", "find_skill", "read_skill", "skills_dirs"]


class Skills:
    """The skill functions of one visit; which skills are loaded (and the text each
    put into the prompt) is rebuilt from the log."""

    def __init__(self, ports: Any, settings: Any, prior: tuple[Any, ...], node_id: str) -> None:
        self.config_dir = ports.options.config_dir
        self.settings = settings
        self.loaded: dict[str, str] = {}  # name -> body, in the order loaded
        self.grants: dict[str, tuple[str, ...]] = {}  # name -> the tools it grants
        for event in prior:
            if isinstance(event, ToolCalled) and event.node_id == node_id and not event.is_error:
                self._track(event)

    def _track(self, event: ToolCalled) -> None:
        try:
            skill = str(json.loads(event.arguments or "{}").get("name") or "")
        except (ValueError, AttributeError):
            return
        if event.name == "skill__load" and skill not in self.loaded:
            body = event.instructions
            if body is None:  # a log from before the body was recorded on its own
                body = _recorded_body(event.result)
            self.loaded[skill] = body
            self.grants[skill] = tuple(event.tools)
        elif event.name == "skill__unload":
            self.loaded.pop(skill, None)
            self.grants.pop(skill, None)

    def instructions(self) -> str:
        """What the loaded skills add to the system prompt."""
        return "\n\n".join(body for body in self.loaded.values() if body)

    def granted(self) -> list[str]:
        """The tools the loaded skills grant, in the order loaded."""
        return list(dict.fromkeys(t for name in self.loaded for t in self.grants.get(name, ())))

    def _allowed(self, name: str) -> bool:
        enabled = self.settings.enabled_skills
        return enabled is None or name in enabled

    def call(self, action: str, args: dict[str, Any], cancel: Any) -> dict[str, Any]:
        """Loki's answer to ``skill__<action>``; a load's body is under ``instructions``
        and its grants under ``tools`` (the toolbox takes both off the answer and
        records them with the call: the model sees Loki's answer)."""
        if not self.settings.skills_enabled:
            return {"error": "Skills are disabled in this context"}
        if action == "list":
            entries = []
            for name in available(self.config_dir):
                if not self._allowed(name):
                    continue
                path = find_skill(name, self.config_dir)
                if path is None:
                    continue
                grants = read_grants(path)
                entries.append(
                    {
                        "name": name,
                        "description": read_skill(path)[0],
                        "grants_tools": [g for g in grants if not g.startswith("mcp:")],
                        "grants_mcp_servers": [g[4:] for g in grants if g.startswith("mcp:")],
                        "loaded": name in self.loaded,
                    }
                )
            return {"skills": entries}
        name = str(args.get("name") or "")
        if not name:
            return {"error": "name is required"}
        if action == "unload":
            if name not in self.loaded:
                return {"error": f"Skill '{name}' is not loaded"}
            del self.loaded[name]
            self.grants.pop(name, None)
            return {"status": "ok", "unloaded": name}
        if action != "load":
            return {"error": f"unknown skill function 'skill__{action}'"}
        if not self._allowed(name):
            return {"error": f"Skill '{name}' is not enabled in this context"}
        path = find_skill(name, self.config_dir)
        if path is None:
            return {"error": f"Failed to load skill '{name}': no such skill"}
        if name in self.loaded:
            return {"error": f"Skill '{name}' is already loaded"}
        _description, body = read_skill(path)
        tools = tuple(read_grants(path))
        if auto_unloads(path):
            import sys

            print(
                f"warning: skill '{name}' sets auto_unload, which graphrun does not honour: "
                "it stays loaded until skill__unload",
                file=sys.stderr,
            )
        self.loaded[name] = body
        self.grants[name] = tools
        return {
            "status": "ok",
            "loaded": name,
            "message": f"Skill '{name}' loaded",
            "instructions": body,
            "tools": list(tools),
        }

    def forget(self, name: str) -> None:
        """Take back a load whose tools could not be offered."""
        self.loaded.pop(name, None)
        self.grants.pop(name, None)


def _recorded_body(result: str) -> str:
    """The body an older log recorded as the load's result (``instructions``)."""
    try:
        value = json.loads(result)
    except ValueError:
        return ""
    body = value.get("instructions") if isinstance(value, dict) else None
    return body if isinstance(body, str) else ""
