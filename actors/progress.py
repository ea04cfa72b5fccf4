"""Progress bars for long loops (knowledge-base builds, test suites), terminal only.

On a terminal the bar is drawn by rich and removed when done; on a pipe or file
nothing is written, so piped output is never corrupted::

    with progress_bar("replaying", total=len(cases)) as advance:
        for case in cases:
            ...
            advance(1)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


def on_terminal(stream: TextIO) -> bool:
    """Whether live output belongs on ``stream`` (a TTY, and ``NO_COLOR`` unset)."""
    try:
        return stream.isatty() and "NO_COLOR" not in os.environ
    except (AttributeError, ValueError):
        return False


@contextmanager
def progress_bar(
    label: str,
    total: int | None,
    *,
    stream: TextIO | None = None,
    force: bool | None = None,
) -> Iterator[Callable[[int], None]]:
    """A transient bar for ``total`` steps (a spinner when ``total`` is None).

    Yields ``advance(n)``. ``force`` overrides the terminal check (tests).
    """
    out = stream or sys.stderr
    live = on_terminal(out) if force is None else force
    if not live:

        def ignore(n: int = 1) -> None:
            return None

        yield ignore
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(file=out, force_terminal=True),
        transient=True,
    )
    task = progress.add_task(label, total=total)

    def advance(n: int = 1) -> None:
        progress.advance(task, n)

    with progress:
        yield advance


__all__ = ["on_terminal", "progress_bar"]
