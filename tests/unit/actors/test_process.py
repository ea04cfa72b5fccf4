"""The one subprocess runner: real children, real process groups, real signals."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from graphrun.actors import process
from graphrun.actors.base import CancelToken

pytestmark = pytest.mark.skipif(os.name != "posix", reason="process groups are POSIX")


def _awaited(*args: Any, **kwargs: Any) -> process.Finished:
    """:func:`process.run_async` on an event loop of its own (as a run's loop awaits it)."""
    return asyncio.run(process.run_async(*args, **kwargs))


@pytest.fixture(params=["blocking", "awaited"])
def run(request: pytest.FixtureRequest) -> Callable[..., process.Finished]:
    """Each behaviour holds for the blocking runner and for the awaited one."""
    return process.run if request.param == "blocking" else _awaited


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def test_output_exit_code_and_an_explicit_environment(
    tmp_path: Path, run: Callable[..., process.Finished]
) -> None:
    ended = run(
        ["sh", "-c", 'echo "out $ONLY"; echo err >&2; echo "home=${HOME-unset}"; exit 3'],
        env={"ONLY": "this", "PATH": os.environ["PATH"]},
        cwd=tmp_path,
        timeout=30,
    )
    assert ended.returncode == 3
    assert ended.stdout == b"out this\nhome=unset\n"  # nothing inherited implicitly
    assert ended.stderr == b"err\n"
    assert not ended.timed_out and not ended.cancelled


def test_the_inherited_environment_is_a_copy_in_bytes(
    monkeypatch: pytest.MonkeyPatch, run: Callable[..., process.Finished]
) -> None:
    monkeypatch.setenv("GRAPHRUN_PROBE", "café")
    env = process.inherited_environment()
    assert env[b"GRAPHRUN_PROBE"] == "café".encode()  # type: ignore[index]
    env[b"GRAPHRUN_PROBE"] = b"changed"  # type: ignore[index]
    assert os.environ["GRAPHRUN_PROBE"] == "café"
    ended = run(["sh", "-c", 'printf %s "$GRAPHRUN_PROBE"'], env=env, timeout=30)
    assert ended.stdout == b"changed"


def test_a_timeout_kills_the_whole_group(
    tmp_path: Path, run: Callable[..., process.Finished]
) -> None:
    pids = tmp_path / "pids"
    script = f'sleep 30 & echo $! > "{pids}"; echo started; sleep 30'
    started = time.monotonic()
    ended = run(["sh", "-c", script], env=dict(os.environ), timeout=0.5)
    assert time.monotonic() - started < 5
    assert ended.timed_out and not ended.cancelled
    assert ended.returncode < 0
    assert ended.stdout == b"started\n"  # what it printed before the kill is kept
    assert _wait_gone(int(pids.read_text()))


def test_leftovers_holding_the_pipes_are_killed_when_the_child_exits(
    tmp_path: Path, run: Callable[..., process.Finished]
) -> None:
    pids = tmp_path / "pids"
    script = f'sleep 30 & echo $! > "{pids}"; echo done'
    started = time.monotonic()
    ended = run(["sh", "-c", script], env=dict(os.environ), timeout=30)
    assert time.monotonic() - started < 3
    assert (ended.returncode, ended.stdout, ended.timed_out) == (0, b"done\n", False)
    assert _wait_gone(int(pids.read_text()))


def test_cancel_from_another_thread_kills_the_group(
    tmp_path: Path, run: Callable[..., process.Finished]
) -> None:
    pids = tmp_path / "pids"
    token = CancelToken()
    script = f'sleep 30 & echo $! > "{pids}"; sleep 30'
    timer = threading.Timer(0.3, token.cancel, args=("run interrupted",))
    timer.start()
    started = time.monotonic()
    try:
        ended = run(["sh", "-c", script], env=dict(os.environ), timeout=60, cancel=token)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 5
    assert ended.cancelled and not ended.timed_out
    assert ended.cancel_reason == "run interrupted"
    assert _wait_gone(int(pids.read_text()))


def test_a_process_object_can_be_cancelled_while_another_thread_waits(tmp_path: Path) -> None:
    child = process.Process(["sleep", "30"], env=dict(os.environ), timeout=60).start()
    assert child.pid is not None
    result: list[process.Finished] = []
    waiter = threading.Thread(target=lambda: result.append(child.wait()))
    waiter.start()
    time.sleep(0.2)
    child.cancel("stop")
    waiter.join(10)
    assert not waiter.is_alive()
    assert result[0].cancelled and result[0].returncode < 0
    assert not _alive(child.pid)
    child.cancel("again")  # after collection: nothing is signalled, nothing raises


def test_an_already_cancelled_token_starts_nothing(
    tmp_path: Path, run: Callable[..., process.Finished]
) -> None:
    marker = tmp_path / "ran"
    token = CancelToken()
    token.cancel("parent finished")
    ended = run(["touch", str(marker)], env=dict(os.environ), timeout=30, cancel=token)
    assert ended.cancelled and ended.cancel_reason == "parent finished"
    assert not marker.exists()


def test_a_missing_program_raises_file_not_found(run: Callable[..., process.Finished]) -> None:
    with pytest.raises(FileNotFoundError):
        run(["graphrun-no-such-program"], env={"PATH": "/nonexistent"}, timeout=5)


def test_kill_running_stops_every_child_still_running(tmp_path: Path) -> None:
    code = (
        "import os, sys, time\n"
        "from graphrun.actors import process\n"
        "child = process.Process(['sleep', '30'], env=dict(os.environ)).start()\n"
        "print(child.pid, flush=True)\n"
        "sys.exit(0)  # exit without waiting: the atexit hook kills the group\n"
    )
    ended = process.run([sys.executable, "-c", code], env=dict(os.environ), timeout=30)
    assert ended.returncode == 0, ended.stderr
    assert _wait_gone(int(ended.stdout))


def test_a_shell_command_line(tmp_path: Path, run: Callable[..., process.Finished]) -> None:
    ended = run(["echo one | tr o 0"], shell=True, env=dict(os.environ), timeout=30)
    assert ended.stdout == b"0ne\n"


def test_an_awaited_process_holds_no_thread(tmp_path: Path) -> None:
    # The child is watched from the loop (its pipes and its pidfd): no thread waits.
    async def main() -> tuple[process.Finished, int]:
        task = asyncio.ensure_future(
            process.run_async(["sh", "-c", "sleep 0.3; echo ok"], env=dict(os.environ), timeout=30)
        )
        await asyncio.sleep(0.1)
        during = threading.active_count()
        return await task, during

    before = threading.active_count()
    ended, during = asyncio.run(main())
    assert ended.stdout == b"ok\n" and ended.returncode == 0
    assert during == before
