"""The one rule for the paths a graph names.

Scripts, ``agent:`` paths, rag ``documents`` (and each file a folder or glob of
them reaches), knowledge-base files and global tool files must lie inside their
folder (the agent's folder; ``functions/tools`` for global tools) once ``..`` and
symlinks are resolved. A graph cannot widen that for itself; the user who runs it
can, in the environment:

* ``GRAPHRUN_ALLOWED_ROOTS``: folders (separated like ``PATH``) a graph may also
  name, e.g. a ``shared/docs`` folder several agents read;
* ``GRAPHRUN_ALLOW_OUTSIDE_PATHS=1``: any path.

``validate`` and the run ask the same function, :func:`outside_problem`, so a
graph that validates is not refused at run time for a path, and the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from graphrun.eventstore.errors import GraphrunError

#: Set to 1 by a user who lets graphs name any path; a graph cannot set it itself.
OUTSIDE_PATHS_ENV = "GRAPHRUN_ALLOW_OUTSIDE_PATHS"
#: Folders (``os.pathsep``-separated) a user lets graphs name besides their own.
ALLOWED_ROOTS_ENV = "GRAPHRUN_ALLOWED_ROOTS"


class PathOutsideError(GraphrunError):
    """A graph names a path outside its folder that the user did not allow."""


def outside_paths_allowed(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user lets graphs name any path (``GRAPHRUN_ALLOW_OUTSIDE_PATHS``)."""
    value = (os.environ if environ is None else environ).get(OUTSIDE_PATHS_ENV, "")
    return value.strip().lower() in ("1", "true", "yes")


def allowed_roots(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The real paths of the folders in ``GRAPHRUN_ALLOWED_ROOTS``."""
    raw = (os.environ if environ is None else environ).get(ALLOWED_ROOTS_ENV, "")
    return tuple(
        os.path.realpath(os.path.expanduser(part.strip()))
        for part in raw.split(os.pathsep)
        if part.strip()
    )


def _within(real: str, root: str) -> bool:
    return real == root or real.startswith(os.path.join(root, ""))


def real_path(folder: str | Path, named: str | Path) -> str:
    """Where ``named`` (relative to ``folder``, or absolute, or ``~``) really is."""
    expanded = os.path.expanduser(os.fspath(named))
    return os.path.realpath(os.path.join(os.path.realpath(folder), expanded))


def outside_problem(
    folder: str | Path | None,
    named: str | Path,
    *,
    what: str,
    place: str = "the agent folder",
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """Why ``named`` may not be used, or ``None``: it must resolve (``..`` and
    symlinks followed) inside ``folder`` or an allowed root, unless the user
    allows any path. ``what`` names the thing (``"script 'x.py'"``); without a
    ``folder`` only what the user allows may be named."""
    real = real_path(folder if folder is not None else os.getcwd(), named)
    inside = folder is not None and _within(real, os.path.realpath(folder))
    if inside or outside_paths_allowed(environ):
        return None
    if any(_within(real, root) for root in allowed_roots(environ)):
        return None
    return f"{what} is outside {place} ({real})"


def outside_hint() -> str:
    """What the user can do about a refused path."""
    return (
        f"keep it inside the folder, or let graphs read there: {ALLOWED_ROOTS_ENV}=DIR "
        f"(or {OUTSIDE_PATHS_ENV}=1), set by the user who runs the graph"
    )


def require_inside(
    folder: str | Path,
    named: str | Path,
    *,
    what: str,
    place: str = "the agent folder",
    error: type[GraphrunError] = PathOutsideError,
) -> str:
    """The real path of ``named``, or ``error`` when :func:`outside_problem` refuses it."""
    problem = outside_problem(folder, named, what=what, place=place)
    if problem is not None:
        raise error(problem, hint=outside_hint())
    return real_path(folder, named)


__all__ = [
    "ALLOWED_ROOTS_ENV",
    "OUTSIDE_PATHS_ENV",
    "PathOutsideError",
    "allowed_roots",
    "outside_hint",
    "outside_paths_allowed",
    "outside_problem",
    "real_path",
    "require_inside",
]
