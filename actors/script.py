"""Script nodes: run ``.sh`` / ``.py`` / ``.ts`` files and record what they printed.

The state goes in ``GRAPH_STATE`` (inline JSON up to 32 KiB) or else in a temp
file named by ``GRAPH_STATE_FILE``; exactly one is set. The script's stdout must
be one JSON object. The process runs in its own process group so a timeout or a
cancellation kills everything it started.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from graphrun.actors.base import EffectContext, all_cpus
from graphrun.actors.lokienv import script_env
from graphrun.actors.messages import ScriptTask
from graphrun.eventstore.codec import content_hash
from graphrun.eventstore.events import ScriptFinished

#: Largest state passed inline in GRAPH_STATE; larger states go through a file.
INLINE_STATE_LIMIT = 32 * 1024
RUNTIMES = {".sh": ["bash"], ".py": ["python3"], ".ts": ["npx", "tsx"]}
_OUTPUT_LIMIT = 4 * 1024 * 1024
_READ_SIZE = 32 * 1024  # per read from a pipe, as communicate() does
_NO_PIDFD_POLL_MS = 50.0
_MAX_POLL_MS = 24 * 3600 * 1000.0  # poll() takes at most INT_MAX ms; wake daily to re-check


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _load(agent_dir: Path, script: str) -> tuple[str, list[str], bytes] | str:
    """``(real path, runtime, script bytes)``, or why the script cannot run.

    Plain strings and one ``open()`` rather than pathlib: this runs every visit
    (``os.path.realpath`` is what ``Path.resolve`` calls, at a third of the cost).
    """
    root = os.path.realpath(agent_dir)
    real = os.path.realpath(os.path.join(root, script))
    if real != root and not real.startswith(os.path.join(root, "")):
        return f"script '{script}' is outside the agent directory"
    extension = os.path.splitext(real)[1]
    runtime = RUNTIMES.get(extension)
    if runtime is None:
        return f"unsupported script extension '{extension}' (use .sh, .py or .ts)"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while chunk := os.read(fd, 64 * 1024):
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        return f"cannot read script {script}: {exc.strerror or exc}"
    return real, runtime, b"".join(chunks)


@functools.lru_cache(maxsize=32)
def _executable(name: str, path: bytes | None) -> str:
    """Where ``name`` is on ``path`` (the script's PATH), looked up once per PATH.

    Given a bare name, the spawned child tries ``execve`` in every PATH directory
    before the one that has it, on every visit; the full path goes straight there.
    Not found: the bare name, so spawning fails as it would have ("not on PATH").
    """
    found = shutil.which(name, path=os.fsdecode(path) if path is not None else None)
    # A relative PATH entry is relative to the script's directory, not to ours.
    return found if found and os.path.isabs(found) else name


# --- spawning cheaply ------------------------------------------------------------------

_env_cache: tuple[dict[bytes, bytes], dict[bytes, bytes]] | None = None


def _script_env() -> dict[bytes, bytes]:
    """A fresh copy of this process's environment minus GRAPH_STATE / GRAPH_STATE_FILE.

    ``dict(os.environ)`` decodes every variable on every call (and Popen encodes them
    all back). ``os.environ._data`` holds them encoded, exactly as Popen would encode
    them, and comparing it to the last snapshot is one C-level dict comparison; the
    bytes copy is rebuilt only when the environment changed.
    """
    global _env_cache
    data: dict[bytes, bytes] | None = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):  # not CPython's os.environ: encode it ourselves
        data = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    cached = _env_cache
    if cached is None or cached[0] != data:
        snapshot = dict(data)
        drop = (b"GRAPH_STATE", b"GRAPH_STATE_FILE")
        cached = (snapshot, {k: v for k, v in snapshot.items() if k not in drop})
        _env_cache = cached
    return cached[1].copy()


def _spawn(
    argv: list[str], cwd: Path, env: dict[bytes, bytes]
) -> tuple[subprocess.Popen[bytes], int, int]:
    """Start the script in a new session: ``(process, stdout fd, stderr fd)``.

    The pipes are made here rather than with ``subprocess.PIPE``, which wraps each
    read end in a buffered file object (fstat, ioctl, lseek) only for it to go unused.
    """
    out_r, out_w = os.pipe()  # not inheritable: only the child's dup2 copies are
    err_r, err_w = os.pipe()
    try:
        # No preexec_fn: it forces a full fork(); without it CPython uses vfork.
        # The runtime may be pinned to one CPU; the script gets every CPU back.
        with all_cpus():
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                start_new_session=True,
            )
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return proc, out_r, err_r


def _communicate(
    proc: subprocess.Popen[bytes], out_fd: int, err_fd: int, timeout: float
) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr to EOF and reap the process: ``(stdout, stderr, timed_out)``.

    One ``poll()`` waits on both pipes and on a pidfd of the process (readable once it
    has exited), with the time left as its timeout; when that runs out the group is
    killed and the wait goes on until everything is closed. When the script exits,
    whatever it left running in its group is killed at once: a background job that
    kept the pipes open would otherwise hold the node until it finished. This
    replaces ``communicate()`` (selectors, per-call bookkeeping) plus a watchdog
    timer, and unlike ``communicate(timeout=)`` it never sleeps in a polling loop
    (except without a pidfd, see below). Closes both fds.
    """
    deadline = time.monotonic() + timeout
    chunks: dict[int, list[bytes]] = {out_fd: [], err_fd: []}
    pidfd: int | None = None
    timed_out = False
    try:
        poller = select.poll()
        poller.register(out_fd, select.POLLIN)
        poller.register(err_fd, select.POLLIN)
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: see below
            pidfd = None
        else:
            poller.register(pidfd, select.POLLIN)
        pending = len(chunks) + (pidfd is not None)
        exited = False
        while pending:
            wait_ms = None
            if not timed_out:
                left = deadline - time.monotonic()
                if not left > 0:  # (NaN too: time out at once rather than never)
                    timed_out = True
                    _kill_group(proc)
                    continue
                wait_ms = min(left * 1000, _MAX_POLL_MS)
            if pidfd is None and not exited:
                # No pidfd: look for the script's exit between short waits.
                wait_ms = min(wait_ms or _NO_PIDFD_POLL_MS, _NO_PIDFD_POLL_MS)
            for fd, _mask in poller.poll(wait_ms):
                data = os.read(fd, _READ_SIZE) if fd != pidfd else b""
                if data:
                    chunks[fd].append(data)
                else:  # EOF, or the process exited
                    poller.unregister(fd)
                    pending -= 1
                    if fd == pidfd:
                        exited = True
                        _kill_group(proc)  # the leftovers, so the pipes close
            if pidfd is None and not exited and proc.poll() is not None:
                exited = True
                _kill_group(proc)
        if pidfd is None and not timed_out:
            # No pidfd: a script that closed its pipes but runs on is waited for here
            # (Popen.wait with a timeout polls with short sleeps).
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        # Whatever the script left running in its group goes too (everything, if this
        # failed). With a pidfd the script has exited but is not reaped yet, so its
        # group id cannot have been reused and the kill finds at least the zombie
        # (no ProcessLookupError to raise and catch).
        _kill_group(proc)
        os.close(out_fd)
        os.close(err_fd)
        if pidfd is not None:
            os.close(pidfd)
    proc.wait()
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), timed_out


def _config_dir(ctx: EffectContext) -> Path | None:
    options = getattr(ctx, "options", None)  # Loki's environment needs the config dir
    value = getattr(options, "config_dir", None)
    return Path(value) if value is not None else None


def run_script(task: ScriptTask, ctx: EffectContext, *, tmp_dir: Path | None = None) -> None:
    """Run the script and record one :class:`ScriptFinished`."""
    started = time.monotonic()

    def finish(**fields: object) -> None:
        ctx.record(
            ScriptFinished(
                node_id=task.node_id,
                visit=task.visit,
                script=task.script,
                input_hash=content_hash(task.state_json),
                duration_ms=round((time.monotonic() - started) * 1000, 3),
                **fields,  # type: ignore[arg-type]
            )
        )

    loaded = _load(ctx.agent_dir, task.script)
    if isinstance(loaded, str):
        finish(error=loaded)
        return
    real_path, runtime, script_bytes = loaded
    script_hash = content_hash(script_bytes)

    env = _script_env()
    env = script_env(env, agent_dir=ctx.agent_dir, config_dir=_config_dir(ctx), script=script_bytes)
    state_file: Path | None = None
    if len(task.state_json.encode("utf-8")) <= INLINE_STATE_LIMIT:
        env[b"GRAPH_STATE"] = os.fsencode(task.state_json)
    else:
        directory = tmp_dir or Path(tempfile.gettempdir())
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{task.node_id}-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(task.state_json)
        state_file = Path(name)
        env[b"GRAPH_STATE_FILE"] = os.fsencode(name)

    try:
        try:
            argv = [_executable(runtime[0], env.get(b"PATH")), *runtime[1:], real_path]
            proc, out_fd, err_fd = _spawn(argv, ctx.agent_dir, env)
        except FileNotFoundError:
            finish(
                script_hash=script_hash,
                error=f"cannot run {task.script}: '{runtime[0]}' is not on PATH",
            )
            return
        unregister = ctx.cancel.on_cancel(lambda: _kill_group(proc))
        try:
            stdout_b, stderr_b, timed_out = _communicate(proc, out_fd, err_fd, task.timeout)
        finally:
            unregister()
    finally:
        if state_file is not None and tmp_dir is None:
            with contextlib.suppress(OSError):
                state_file.unlink()
    stdout = stdout_b[:_OUTPUT_LIMIT].decode("utf-8", errors="replace")
    stderr = stderr_b[-_OUTPUT_LIMIT:].decode("utf-8", errors="replace")
    code = proc.returncode
    if timed_out:
        finish(
            script_hash=script_hash,
            stdout=stdout,
            stderr=stderr,
            timed_out=True,
            error=f"script timed out after {task.timeout:g}s",
        )
        return
    if ctx.cancel.cancelled:
        finish(
            script_hash=script_hash,
            stdout=stdout,
            stderr=stderr,
            error=f"script cancelled ({ctx.cancel.reason})",
        )
        return
    if code != 0:
        tail = stderr.strip().splitlines()[-1:] if stderr.strip() else []
        detail = f": {tail[0]}" if tail else ""
        finish(
            script_hash=script_hash,
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            error=f"script exited with code {code}{detail}",
        )
        return
    try:
        value = json.loads(stdout)
    except json.JSONDecodeError as exc:
        finish(
            script_hash=script_hash,
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            error=f"script output is not valid JSON ({exc.msg} at line {exc.lineno})",
        )
        return
    if not isinstance(value, dict):
        finish(
            script_hash=script_hash,
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            error=f"script output must be a JSON object, got {type(value).__name__}",
        )
        return
    finish(script_hash=script_hash, exit_code=code, output=value, stderr=stderr)


class ScriptActor:
    """The ``script`` node actor."""

    node_type = "script"

    def __init__(self, tmp_dir: Path | None = None) -> None:
        self.tmp_dir = tmp_dir

    def perform(self, task: ScriptTask, ctx: EffectContext) -> None:
        run_script(task, ctx, tmp_dir=self.tmp_dir)
