"""``skill__*``: Loki's skill documents (``<skills dir>/<name>/SKILL.md``).

The skills directory is ``$COYOTE_SKILLS_DIR`` (or ``$LOKI_SKILLS_DIR``), else
``skills/`` of the configuration directory; a project's own ``.coyote/skills``
(or ``.loki/skills``) in the working directory comes first, as in Loki. A skill's
YAML front matter gives its ``description``; the rest is its body. ``skill__load``
hands the body to the model as the call's result, so the log records exactly the
text the model was given (a replay compares it with the document of today).
"""

from __future__ import annotations

from typing import Any

from graphrun.eventstore.events import ToolCalled
from graphrun.runtime.graph.skills import available, find_skill, read_skill, skills_dirs

__all__ = ["Skills", "available", "find_skill", "read_skill", "skills_dirs"]


class Skills:
    """The skill functions of one visit; which skills are loaded is rebuilt from the log."""

    def __init__(self, ports: Any, settings: Any, prior: tuple[Any, ...], node_id: str) -> None:
        self.config_dir = ports.options.config_dir
        self.settings = settings
        self.loaded: list[str] = []
        for event in prior:
            if isinstance(event, ToolCalled) and event.node_id == node_id and not event.is_error:
                self._track(event.name, event.arguments)

    def _track(self, name: str, arguments: str) -> None:
        import json

        try:
            skill = str(json.loads(arguments or "{}").get("name") or "")
        except (ValueError, AttributeError):
            return
        if name == "skill__load" and skill not in self.loaded:
            self.loaded.append(skill)
        elif name == "skill__unload" and skill in self.loaded:
            self.loaded.remove(skill)

    def _allowed(self, name: str) -> bool:
        enabled = self.settings.enabled_skills
        return enabled is None or name in enabled

    def call(self, action: str, args: dict[str, Any], cancel: Any) -> dict[str, Any]:
        if not self.settings.skills_enabled:
            return {"error": "Skills are disabled in this context"}
        if action == "list":
            entries = []
            for name in available(self.config_dir):
                if not self._allowed(name):
                    continue
                path = find_skill(name, self.config_dir)
                description = read_skill(path)[0] if path is not None else ""
                entries.append(
                    {"name": name, "description": description, "loaded": name in self.loaded}
                )
            return {"skills": entries}
        name = str(args.get("name") or "")
        if not name:
            return {"error": "name is required"}
        if action == "unload":
            if name not in self.loaded:
                return {"error": f"Skill '{name}' is not loaded"}
            self.loaded.remove(name)
            return {"status": "ok", "unloaded": name, "message": f"Skill '{name}' unloaded"}
        if action != "load":
            return {"error": f"unknown skill function 'skill__{action}'"}
        if not self._allowed(name):
            return {"error": f"Skill '{name}' is not enabled in this context"}
        path = find_skill(name, self.config_dir)
        if path is None:
            return {"error": f"Failed to load skill '{name}': no such skill"}
        _description, body = read_skill(path)
        if name not in self.loaded:
            self.loaded.append(name)
        return {
            "status": "ok",
            "loaded": name,
            "message": f"Skill '{name}' loaded",
            "instructions": body,
        }
