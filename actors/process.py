"""The one subprocess runner: scripts, bash and Python tools, document loaders.

Every child starts in a session (and so a process group) of its own, with its
standard input closed, its output captured through pipes and its environment
given explicitly (never inherited implicitly). Whatever stops it (its timeout,
a cancellation from any thread, or simply its exit) kills the whole group, so
nothing it started outlives it: a background job left holding the pipes would
otherwise keep the node waiting until it finished.

Two ways to wait, with the same rules: :func:`run` blocks its thread
(:meth:`subprocess.Popen.communicate` with a timeout), for callers on a thread of
their own (a tool, a document loader); :func:`run_async` is awaited on a run's
event loop (a script node), which watches the child's pipes and its pidfd, so no
thread waits on it. Nothing here changes the calling process (no signal handlers,
no child watcher, no affinity, no scheduler).

Children die with graphrun, even with ``kill -9``:

* every child carries ``GRAPHRUN_OWNER=<host>:<pid>:<start time>`` (this
  process) in its environment, which its own children inherit;
* the first child starts the *lifeline*: a tiny process in a session of its own
  that holds the read end of a pipe only this process writes to, and learns each
  child's process group through it. When this process ends, however it ends, the
  kernel closes the pipe; the lifeline then kills those groups and every process
  still carrying this process's mark (a grandchild that left the group), and exits;
* :func:`end_orphans` (run by ``resume`` and by a worker taking a run over) kills
  what a dead graphrun left on this host should its lifeline have died with it:
  processes marked by an owner that is gone (pid absent, or started at another
  time: a reused pid is not the owner).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        lifeline = _LIFELINE.ensure() if _POSIX else None
        with self._lock:
            if self._cancel_reason is not None:
                raise ProcessCancelled(self._cancel_reason)
            self._proc = subprocess.Popen(
                command,
                cwd=self.cwd,
                env=marked(self.env),
                shell=self.shell,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=_POSIX,
                creationflags=group,
            )
            if lifeline is not None:
                lifeline.watch(self._proc.pid)
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
                _LIFELINE.forget(proc.pid)
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

    async def wait_async(self) -> Finished:
        """:meth:`wait`, awaited on an event loop: the pipes are read as they become
        readable and the child's exit is seen through its pidfd (polled where the
        system has none), so no thread waits on the child. The same rules: the
        group is killed when the child exits with its pipes still held, when the
        timeout passes or when it is cancelled, and pipes still open a while after
        a kill are abandoned."""
        import asyncio

        proc = self._proc
        if proc is None:
            raise RuntimeError("the process was not started")
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        readers = [_PipeReader(loop, pipe) for pipe in (proc.stdout, proc.stderr)]
        exited = _exit_watch(loop, proc)
        pipes = asyncio.gather(*(reader.closed for reader in readers))
        timed_out = False
        try:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait(
                [pipes, exited], timeout=left, return_when=asyncio.FIRST_COMPLETED
            )
            if pipes not in done:
                if exited not in done:
                    timed_out = True  # still running at its deadline
                # Gone (killed by a cancel, or exited) with its pipes held by what it
                # left running, or out of time: its group goes, so the pipes close.
                self._kill()
                await asyncio.wait([pipes], timeout=_DRAIN_AFTER_KILL)
            elif exited not in done:
                # Its output is closed but it runs on: its exit (or its deadline).
                left = None if deadline is None else max(0.0, deadline - loop.time())
                await asyncio.wait([exited], timeout=left)
                if not exited.done():
                    timed_out = True
        finally:
            for reader in readers:
                reader.stop()
            exited.cancel()
            pipes.cancel()
            with self._lock:
                _kill_group(proc)
                if proc.returncode is None:
                    proc.wait()
                self._done = True
                _LIFELINE.forget(proc.pid)
            _RUNNING.discard(self)
        cancelled = self._cancel_reason is not None and not timed_out
        return Finished(
            returncode=proc.returncode,
            stdout=readers[0].data(),
            stderr=readers[1].data(),
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
    with _launched(argv, env=env, cwd=cwd, timeout=timeout, cancel=cancel, shell=shell) as child:
        return child if isinstance(child, Finished) else child.wait()


async def run_async(
    argv: Sequence[str],
    *,
    env: Env,
    cwd: Path | str | None = None,
    timeout: float | None = None,
    cancel: CancelToken | None = None,
    shell: bool = False,
) -> Finished:
    """:func:`run`, awaited on an event loop (:meth:`Process.wait_async`)."""
    with _launched(argv, env=env, cwd=cwd, timeout=timeout, cancel=cancel, shell=shell) as child:
        return child if isinstance(child, Finished) else await child.wait_async()


@contextlib.contextmanager
def _launched(
    argv: Sequence[str],
    *,
    env: Env,
    cwd: Path | str | None,
    timeout: float | None,
    cancel: CancelToken | None,
    shell: bool,
) -> Iterator[Process | Finished]:
    """The started child, killed when ``cancel`` fires while it is collected; or,
    when ``cancel`` had fired already, the cancelled empty result instead."""
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
            yield Finished(-1, b"", b"", cancelled=True, cancel_reason=str(stopped))
            return
        yield process
    finally:
        unregister()


class _PipeReader:
    """Reads one of a child's pipes on an event loop until it closes (``closed``)."""

    def __init__(self, loop: Any, pipe: Any) -> None:
        self.loop = loop
        self.closed = loop.create_future()
        self._chunks: list[bytes] = []
        self._fd = -1
        if pipe is None:
            self.closed.set_result(None)
            return
        self._pipe = pipe
        self._fd = pipe.fileno()
        os.set_blocking(self._fd, False)
        loop.add_reader(self._fd, self._readable)

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self._chunks.append(chunk)
            return
        self.stop()

    def stop(self) -> None:
        """Stop reading (at the end of the output, or abandoning the pipe)."""
        if self._fd >= 0:
            self.loop.remove_reader(self._fd)
            self._fd = -1
            with contextlib.suppress(OSError):
                self._pipe.close()
        if not self.closed.done():
            self.closed.set_result(None)

    def data(self) -> bytes:
        return b"".join(self._chunks)


def _exit_watch(loop: Any, proc: subprocess.Popen[bytes]) -> Any:
    """A future done when ``proc`` has exited (not reaped: the caller reaps it):
    through a pidfd where the system has them, else by polling."""
    import asyncio

    pidfd_open = getattr(os, "pidfd_open", None)
    fd = -1
    if pidfd_open is not None:
        with contextlib.suppress(OSError):
            fd = pidfd_open(proc.pid)
    if fd < 0:
        return asyncio.ensure_future(_poll_exit(proc))
    exited = loop.create_future()

    def readable() -> None:
        if not exited.done():
            exited.set_result(None)

    def close(_: Any) -> None:
        loop.remove_reader(fd)
        os.close(fd)

    loop.add_reader(fd, readable)
    exited.add_done_callback(close)
    return exited


async def _poll_exit(proc: subprocess.Popen[bytes]) -> None:
    """Wait for ``proc`` to exit by polling (quickly at first, then less often)."""
    import asyncio

    slice_s = _FIRST_SLICE
    while proc.poll() is None:
        await asyncio.sleep(slice_s)
        slice_s = min(slice_s * 2, _MAX_SLICE)


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


# -- children die with graphrun -------------------------------------------------------

#: Marks every child (and what it starts) with the graphrun process that owns it.
OWNER_ENV = "GRAPHRUN_OWNER"

_marks: dict[int, str] = {}


def owner_mark(pid: int | None = None) -> str:
    """``<host>:<pid>:<start time>`` of this process (or of ``pid``, with psutil)."""
    pid = os.getpid() if pid is None else pid
    mark = _marks.get(pid)
    if mark is None:
        import psutil

        started = psutil.Process(pid).create_time()
        mark = _marks[pid] = f"{socket.gethostname()}:{pid}:{started!r}"
    return mark


def marked(env: Env) -> Env:
    """``env`` with this process's :data:`OWNER_ENV` mark (bytes or text, like ``env``)."""
    if any(isinstance(key, bytes) for key in env):
        as_bytes: dict[bytes, bytes] = dict(env)  # type: ignore[arg-type]
        as_bytes[OWNER_ENV.encode()] = owner_mark().encode()
        return as_bytes
    as_text: dict[str, str] = dict(env)  # type: ignore[arg-type]
    as_text[OWNER_ENV] = owner_mark()
    return as_text


#: The lifeline's program, run as a file: it imports nothing of graphrun.
_LIFELINE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lifeline.py")


class _Lifeline:
    """The lifeline process of this graphrun process (started with its first child)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe: int | None = None
        self._owner = 0  # the pid that started it (a forked copy starts its own)
        self.pid: int | None = None

    def ensure(self) -> _Lifeline | None:
        """The running lifeline (started now if need be); ``None`` if it cannot start."""
        with self._lock:
            if self._pipe is not None and self._owner == os.getpid():
                return self
            argv = [sys.executable, "-I", "-S", _LIFELINE_FILE, f"{OWNER_ENV}={owner_mark()}"]
            read_end, write_end = os.pipe()  # both close on exec: only the dup2 survives
            try:
                # Spawned, not a Popen: it is never waited for (it outlives this
                # process by design, and init reaps it).
                pid = os.posix_spawn(
                    sys.executable,
                    argv,
                    {},
                    file_actions=[
                        (os.POSIX_SPAWN_DUP2, read_end, 0),
                        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                        (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                    ],
                    setsid=True,
                )
            except (OSError, AttributeError, NotImplementedError):
                os.close(write_end)
                return None  # the group kills at exit still apply
            finally:
                os.close(read_end)
            # A bare descriptor, never closed: the kernel closes it when this process
            # ends, which is the lifeline's signal.
            self._pipe, self._owner, self.pid = write_end, os.getpid(), pid
            return self

    def _send(self, line: str) -> None:
        with self._lock:
            if self._pipe is None or self._owner != os.getpid():
                return
            try:
                os.write(self._pipe, line.encode())
            except OSError:  # the lifeline is gone: the next child starts another
                with contextlib.suppress(OSError):
                    os.close(self._pipe)
                self._pipe = None

    def watch(self, pgid: int) -> None:
        self._send(f"+ {pgid}\n")

    def forget(self, pgid: int) -> None:
        self._send(f"- {pgid}\n")


_LIFELINE = _Lifeline()


def end_orphans(*, host: str | None = None) -> list[int]:
    """Kill, on this host, every process a dead graphrun process left (marked by an
    owner whose pid is gone or belongs to a process started at another time);
    returns their pids. ``resume`` and a worker taking a run over call it before
    performing anything again, so no node runs beside its orphan."""
    import psutil

    here = socket.gethostname()
    if host is not None and host != here:
        return []  # another host's processes cannot be seen
    killed: list[psutil.Process] = []
    alive: dict[str, bool] = {}
    for proc, mark in _marked_processes():
        if proc.pid == os.getpid():
            continue
        mark_host, _, rest = mark.partition(":")
        pid_text, _, started_text = rest.partition(":")
        if mark_host != here or not pid_text.isdigit():
            continue
        if mark not in alive:
            alive[mark] = _owner_alive(int(pid_text), started_text)
        if not alive[mark]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
                killed.append(proc)
    _wait_dead(killed, timeout=2.0)  # dead before anything is performed again
    return [proc.pid for proc in killed]


def _wait_dead(processes: list[Any], *, timeout: float) -> None:
    """Wait until each process is gone or a zombie (dead; reaping it is its new
    parent's business, which may be slow where PID 1 is no real init)."""
    import psutil

    deadline = time.monotonic() + timeout
    left = list(processes)
    while left and time.monotonic() < deadline:
        still = []
        for proc in left:
            with contextlib.suppress(psutil.Error):
                if proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
        left = still
        if left:
            time.sleep(0.01)


def _marked_processes() -> Iterator[tuple[Any, str]]:
    """Every process with an :data:`OWNER_ENV` mark, and the mark. On Linux the
    environments are searched as bytes first (a few milliseconds for hundreds of
    processes); only the marked ones are parsed."""
    import psutil

    needle = b"\0" + OWNER_ENV.encode() + b"="
    if os.path.isdir("/proc"):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    raw = b"\0" + fh.read()
            except OSError:
                continue
            at = raw.find(needle)
            if at < 0:
                continue
            value = raw[at + len(needle) :].split(b"\0", 1)[0]
            with contextlib.suppress(psutil.Error):
                yield psutil.Process(int(name)), value.decode("utf-8", "replace")
        return
    for proc in psutil.process_iter():
        try:
            mark = proc.environ().get(OWNER_ENV)
        except (psutil.Error, OSError):
            continue
        if mark:
            yield proc, mark


def _owner_alive(pid: int, started_text: str) -> bool:
    import psutil

    try:
        started = float(started_text)
        process = psutil.Process(pid)
        if abs(process.create_time() - started) > 0.01:
            return False  # the pid was reused
        return bool(process.status() != psutil.STATUS_ZOMBIE)
    except (ValueError, psutil.NoSuchProcess):
        return False
    except psutil.Error:
        return True


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
    "OWNER_ENV",
    "Env",
    "Finished",
    "Process",
    "ProcessCancelled",
    "end_orphans",
    "inherited_environment",
    "kill_running",
    "marked",
    "owner_mark",
    "run",
]
