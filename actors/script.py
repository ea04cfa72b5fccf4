"""Script nodes: run ``.sh`` / ``.py`` / ``.ts`` files and record what they printed.

The state goes in ``GRAPH_STATE`` (inline JSON up to 32 KiB) or else in a temp
file named by ``GRAPH_STATE_FILE``; exactly one is set. The script's stdout must
be one JSON object. The process runs in its own process group so a timeout or a
cancellation kills everything it started.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from graphrun.actors.base import EffectContext, all_cpus, watchdog
from graphrun.actors.messages import ScriptTask
from graphrun.eventstore.codec import content_hash
from graphrun.eventstore.events import ScriptFinished

#: Largest state passed inline in GRAPH_STATE; larger states go through a file.
INLINE_STATE_LIMIT = 32 * 1024
RUNTIMES = {".sh": ["bash"], ".py": ["python3"], ".ts": ["npx", "tsx"]}
_OUTPUT_LIMIT = 4 * 1024 * 1024


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def resolve_script(agent_dir: Path, script: str) -> Path:
    root = agent_dir.resolve()
    path = (root / script).resolve()
    if not path.is_relative_to(root):
        raise ValueError(f"script '{script}' is outside the agent directory")
    return path


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

    try:
        path = resolve_script(ctx.agent_dir, task.script)
    except ValueError as exc:
        finish(error=str(exc))
        return
    runtime = RUNTIMES.get(path.suffix)
    if runtime is None:
        finish(error=f"unsupported script extension '{path.suffix}' (use .sh, .py or .ts)")
        return
    try:
        script_bytes = path.read_bytes()
    except OSError as exc:
        finish(error=f"cannot read script {task.script}: {exc.strerror or exc}")
        return
    script_hash = content_hash(script_bytes)

    env = dict(os.environ)
    env.pop("GRAPH_STATE", None)
    env.pop("GRAPH_STATE_FILE", None)
    state_file: Path | None = None
    if len(task.state_json.encode("utf-8")) <= INLINE_STATE_LIMIT:
        env["GRAPH_STATE"] = task.state_json
    else:
        directory = tmp_dir or Path(tempfile.gettempdir())
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{task.node_id}-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(task.state_json)
        state_file = Path(name)
        env["GRAPH_STATE_FILE"] = name

    try:
        # No preexec_fn: it forces a full fork(); without it CPython uses vfork.
        # The runtime may be pinned to one CPU; the script gets every CPU back.
        with all_cpus():
            proc = subprocess.Popen(
                [*runtime, str(path)],
                cwd=ctx.agent_dir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
    except FileNotFoundError:
        finish(
            script_hash=script_hash,
            error=f"cannot run {task.script}: '{runtime[0]}' is not on PATH",
        )
        return
    unregister = ctx.cancel.on_cancel(lambda: _kill_group(proc))
    # A timer kills the group on expiry; communicate() without a timeout then
    # returns as soon as the pipes close (with a timeout it polls with sleeps).
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        _kill_group(proc)

    timer = watchdog.schedule(task.timeout, expire)
    try:
        stdout_b, stderr_b = proc.communicate()
    finally:
        watchdog.cancel(timer)
        unregister()
        # Whatever the script left running in its group goes too.
        _kill_group(proc)
        if state_file is not None and tmp_dir is None:
            with contextlib.suppress(OSError):
                state_file.unlink()
    timed_out = expired.is_set()
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
