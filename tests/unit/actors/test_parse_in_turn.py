"""Python sources are parsed one thread at a time.

CPython 3.11's ``ast.parse`` can fail with "SystemError: AST constructor recursion
depth mismatch" when threads parse at once (python/cpython#106905); a step's
parallel tool nodes load their tool files on the run's executor threads together.
"""

from __future__ import annotations

import ast
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from graphrun.actors.tools.toolbox import parse_python_tools
from graphrun.runtime.graph.expressions import parse

TOOLS = '''
def lookup(order_id: str) -> str:
    """Look an order up.

    Args:
        order_id: The order id.
    """
    return order_id
'''


def test_tool_files_and_expressions_are_parsed_one_thread_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = ast.parse
    inside = 0
    most = 0
    lock = threading.Lock()

    def slow_parse(*args: Any, **kwargs: Any) -> Any:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)  # long enough for the other threads to arrive meanwhile
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                inside -= 1

    monkeypatch.setattr(ast, "parse", slow_parse)
    path = tmp_path / "tools.py"
    path.write_text(TOOLS)

    def work(i: int) -> int:
        if i % 2:
            return len(parse_python_tools(path, source=TOOLS))
        return len(parse("status == 'shipped'").body._fields)

    with ThreadPoolExecutor(6) as pool:
        done = list(pool.map(work, range(12)))
    assert all(done)
    assert most == 1
