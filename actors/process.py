"""The one subprocess runner: scripts, bash and Python tools, document loaders.

Every child starts in a session (and so a process group) of its own, with its
standard input closed, its output captured through pipes and its environment
given explicitly (never inherited implicitly). Whatever stops it (its timeout,
a cancellation from any thread, or simply its exit) kills the whole group, so
nothing it started outlives it: a background job left holding the pipes would
otherwise keep the node waiting until it finished.

Built on :meth:`subprocess.Popen.communicate` with a timeout; nothing here
changes the calling process (no signal handlers, no affinity, no scheduler).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from graphrun.actors.base import CancelToken

#: The environment a child gets: text or bytes keys and values, as Popen takes them.
Env = Mapping[str, str] | Mapping[bytes, bytes]

# While the child runs, ``communicate`` waits this long at first between looks at
# whether the child itself has exited (its group may keep the pipes open), then
# twice as long each time, up to _MAX_SLICE: a quick script is seen at once,
# and a long one costs a few wake-ups a second.
_FIRST_SLICE = 0.005
_MAX_SLICE = 0.25
# After the group is killed, how long to wait for the pipes to close (a
# grandchild that left the group can still hold them).
_DRAIN_AFTER_KILL = 2.0

_POSIX = os.name == "posix"


def inherited_environment() -> dict[bytes, bytes] | dict[str, str]:
    """A copy of this process's environment, to extend and pass to a child.

    Bytes on POSIX (``os.environb``: what the child will get, byte for byte, with
    no decoding and re-encoding); text where there is no bytes view (Windows).
    """
    environb = getattr(os, "environb", None)
    if environb is not None:
        return dict(environb)
    return dict(os.environ)


@dataclass(frozen=True)
class Finished:
    """How a child ended: its exit code and output, and whether it was stopped.

    ``returncode`` is negative (the signal) when the child was killed.
    ``timed_out`` and ``cancelled`` say which of the two stopped it, if either did.
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    cancelled: bool = False
    cancel_reason: str | None = None


class Process:
    """A child process in its own session.

    Start it with :meth:`start`, collect it with :meth:`wait`; :meth:`cancel` may
    be called from any thread at any time (before, during or after the wait) and
    kills the child's whole process group.

    Args:
        argv: The program and its arguments (a one-element list with ``shell=True``:
            the command line).
        env: The complete environment of the child.
        cwd: Its working directory (default: ours).
        timeout: Seconds it may run (``None``: no limit).
        shell: Run ``argv[0]`` through ``/bin/sh -c`` (document loaders are command
            lines).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Env,
        cwd: Path | str | None = None,
        timeout: float | None = None,
        shell: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        # NaN or a negative budget: no time at all (never "no limit").
        self.timeout = timeout if timeout is None or timeout > 0 else 0.0
        self.shell = shell
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._done = False
        self._cancel_reason: str | None = None

    @property
    def pid(self) -> int | None:
        """The child's pid (also its process group id), once started."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> Process:
        """Start the child (raises ``OSError``, e.g. ``FileNotFoundError``, if it cannot)."""
        # POSIX: a session of its own (its group is what a kill addresses). Windows: a
        # process group that CTRL_BREAK and kill address.
        group = 0 if _POSIX else getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)
        command: str | list[str] = self.argv[0] if self.shell else self.argv
        with self._lock:
            if self._cancel_reason is not None:
                raise ProcessCancelled(self._cancel_reason)
            self._proc = subprocess.Popen(
                command,
                cwd=self.cwd,
                env=self.env,
                shell=self.shell,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=_POSIX,
                creationflags=group,
            )
        _RUNNING.add(self)
        return self

    def cancel(self, reason: str = "cancelled") -> None:
        """Kill the child's group (thread-safe; a no-op once it has been collected)."""
        with self._lock:
            if self._cancel_reason is None:
                self._cancel_reason = reason
            if self._proc is not None and not self._done:
                _kill_group(self._proc)

    def wait(self) -> Finished:
        """Read the child's output to the end, reap it, and kill what it left behind."""
        proc = self._proc
        if proc is None:
            raise RuntimeError("the process was not started")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        timed_out = False
        exited = False
        slice_s = _FIRST_SLICE
        try:
            while True:
                wait_s = slice_s
                if deadline is not None and not timed_out:
                    wait_s = min(wait_s, max(0.0, deadline - time.monotonic()))
                try:
                    stdout, stderr = proc.communicate(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                slice_s = min(slice_s * 2, _MAX_SLICE)
                if not exited and proc.poll() is not None:
                    # The child is gone but its pipes are still open: whatever it
                    # left running holds them. It goes, so the pipes close.
                    exited = True
                    self._kill()
                if deadline is not None and not timed_out and time.monotonic() >= deadline:
                    timed_out = True
                    self._kill()
                if (timed_out or exited or self._cancel_reason) and slice_s >= _MAX_SLICE:
                    # Killed, and the pipes are still open after a while: a process
                    # that left the group holds them. Stop reading.
                    stdout, stderr = self._abandon_pipes(proc)
                    break
        finally:
            with self._lock:
                # Everything the child left running in its group goes too (all of
                # it, if reading failed); then the group is never signalled again.
                _kill_group(proc)
                if proc.returncode is None:
                    proc.wait()
                self._done = True
            _RUNNING.discard(self)
        cancelled = self._cancel_reason is not None and not timed_out
        return Finished(
            returncode=proc.returncode,
            stdout=stdout,
            stderr=stderr,
            timed_out=timed_out,
            cancelled=cancelled,
            cancel_reason=self._cancel_reason if cancelled else None,
        )

    def _kill(self) -> None:
        with self._lock:
            if self._proc is not None and not self._done:
                _kill_group(self._proc)

    def _abandon_pipes(self, proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
        try:
            return proc.communicate(timeout=_DRAIN_AFTER_KILL)
        except subprocess.TimeoutExpired:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            return b"", b""


class ProcessCancelled(Exception):
    """A process was cancelled before it could start."""


def run(
    argv: Sequence[str],
    *,
    env: Env,
    cwd: Path | str | None = None,
    timeout: float | None = None,
    cancel: CancelToken | None = None,
    shell: bool = False,
) -> Finished:
    """Run a child to its end (or its timeout, or ``cancel``) and return how it ended.

    Raises ``OSError`` when the program cannot be started. A ``cancel`` token that
    has already fired starts nothing: the result is a cancelled, empty run.
    """
    process = Process(argv, env=env, cwd=cwd, timeout=timeout, shell=shell)
    unregister = (
        (lambda: None)
        if cancel is None
        else cancel.on_cancel(lambda: process.cancel(cancel.reason or "cancelled"))
    )
    try:
        try:
            process.start()
        except ProcessCancelled as stopped:
            return Finished(-1, b"", b"", cancelled=True, cancel_reason=str(stopped))
        return process.wait()
    finally:
        unregister()


def kill_running() -> None:
    """Kill the group of every child of this process still running (at exit, or when
    the run loop is stopped by a signal)."""
    for process in _RUNNING.snapshot():
        process.cancel("graphrun is exiting")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    if _POSIX:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    else:  # pragma: no cover - Windows has no process groups to signal
        with contextlib.suppress(OSError):
            proc.kill()


class _Running:
    """The children started and not yet collected (so that an exit can kill them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: set[Process] = set()

    def add(self, process: Process) -> None:
        with self._lock:
            self._processes.add(process)

    def discard(self, process: Process) -> None:
        with self._lock:
            self._processes.discard(process)

    def snapshot(self) -> list[Process]:
        with self._lock:
            return list(self._processes)


_RUNNING = _Running()
atexit.register(kill_running)

__all__ = [
    "Env",
    "Finished",
    "Process",
    "ProcessCancelled",
    "inherited_environment",
    "kill_running",
    "run",
]
