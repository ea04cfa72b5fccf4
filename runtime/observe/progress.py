"""Progress bars for long loops: see :mod:`graphrun.actors.progress` (effects below
the runtime use them too, so they live there)."""

from __future__ import annotations

from graphrun.actors.progress import on_terminal, progress_bar

__all__ = ["on_terminal", "progress_bar"]
