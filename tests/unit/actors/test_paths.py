"""The one path rule: inside the folder after ``..`` and symlinks, unless the user
allows a root or any path."""

from __future__ import annotations

import os
from pathlib import Path

from graphrun.actors.paths import allowed_roots, outside_problem, real_path


def test_inside_outside_and_the_allowances(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    (agent / "sub").mkdir(parents=True)
    shared = tmp_path / "shared"
    shared.mkdir()
    (agent / "link").symlink_to(shared, target_is_directory=True)
    none: dict[str, str] = {}
    assert outside_problem(agent, "sub/x.md", what="w", environ=none) is None
    assert outside_problem(agent, "sub/../x.md", what="w", environ=none) is None
    assert outside_problem(agent, str(agent / "x.md"), what="w", environ=none) is None
    for named in ("../shared/x.md", "link/x.md", str(shared / "x.md"), "sub/../../x"):
        problem = outside_problem(agent, named, what=f"document '{named}'", environ=none)
        assert problem == (
            f"document '{named}' is outside the agent folder ({real_path(agent, named)})"
        )
    roots = {"GRAPHRUN_ALLOWED_ROOTS": f"{tmp_path / 'nowhere'}{os.pathsep}{shared}"}
    assert outside_problem(agent, "link/x.md", what="w", environ=roots) is None
    assert outside_problem(agent, "../x.md", what="w", environ=roots) is not None
    # A root is a folder, not a prefix of names.
    prefix = {"GRAPHRUN_ALLOWED_ROOTS": str(tmp_path / "sha")}
    assert outside_problem(agent, "../shared/x.md", what="w", environ=prefix) is not None
    anything = {"GRAPHRUN_ALLOW_OUTSIDE_PATHS": "1"}
    assert outside_problem(agent, "/etc/passwd", what="w", environ=anything) is None
    assert outside_problem(None, "/etc/passwd", what="w", environ=none) is not None


def test_allowed_roots_are_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    env = {"GRAPHRUN_ALLOWED_ROOTS": f" {tmp_path / 'alias'} {os.pathsep}{os.pathsep}"}
    assert allowed_roots(env) == (os.path.realpath(tmp_path / "real"),)
