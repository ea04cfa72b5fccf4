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
import tempfile
import time
from pathlib import Path
from typing import Any

from graphrun.actors import process
from graphrun.actors.base import EffectContext
from graphrun.actors.messages import ScriptTask
from graphrun.actors.paths import outside_problem
from graphrun.actors.tools.lokienv import script_env, work_dir
from graphrun.eventstore.codec import content_hash
from graphrun.eventstore.events import ScriptFinished

#: Largest state passed inline in GRAPH_STATE; larger states go through a file.
INLINE_STATE_LIMIT = 32 * 1024
RUNTIMES = {".sh": ["bash"], ".py": ["python3"], ".ts": ["npx", "tsx"]}
_OUTPUT_LIMIT = 4 * 1024 * 1024


def _load(agent_dir: Path, script: str) -> tuple[str, list[str], bytes] | str:
    """``(real path, runtime, script bytes)``, or why the script cannot run.

    Plain strings and one ``open()`` rather than pathlib: this runs every visit
    (``os.path.realpath`` is what ``Path.resolve`` calls, at a third of the cost).
    """
    root = os.path.realpath(agent_dir)
    real = os.path.realpath(os.path.join(root, script))
    if real != root and not real.startswith(os.path.join(root, "")):
        problem = outside_problem(root, script, what=f"script '{script}'")
        if problem is not None:
            return problem
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


def _script_env() -> dict[Any, Any]:
    """A copy of this process's environment minus GRAPH_STATE / GRAPH_STATE_FILE
    (one of them is set per visit)."""
    env: dict[Any, Any] = process.inherited_environment()
    for key in ("GRAPH_STATE", "GRAPH_STATE_FILE"):
        env.pop(_key(key), None)
    return env


def _set(env: dict[Any, Any], key: str, value: str) -> None:
    env[_key(key)] = os.fsencode(value) if _BYTES_ENV else value


def _key(name: str) -> str | bytes:
    return os.fsencode(name) if _BYTES_ENV else name


_BYTES_ENV = hasattr(os, "environb")  # POSIX: the environment is passed as bytes


def _config_dir(ctx: EffectContext) -> Path | None:
    options = getattr(ctx, "options", None)  # Loki's environment needs the config dir
    value = getattr(options, "config_dir", None)
    return Path(value) if value is not None else None


async def run_script_async(
    task: ScriptTask, ctx: EffectContext, *, tmp_dir: Path | None = None
) -> None:
    """Run the script and record one :class:`ScriptFinished`, awaited on the run's
    loop: the process is watched from the loop. A state too large for the
    environment is written to its file on the run's executor; the script itself (a
    small file) is read in place."""
    from graphrun.actors.loop import blocking

    run = _ScriptRun(task, ctx, tmp_dir)
    if len(task.state_json) * 4 > INLINE_STATE_LIMIT:  # (UTF-8: up to 4 bytes a character)
        argv = await blocking(ctx, run.prepare)
    else:
        argv = run.prepare()
    if argv is None:
        return
    try:
        ended = await process.run_async(
            argv, env=run.env, cwd=work_dir(ctx.agent_dir), timeout=task.timeout, cancel=ctx.cancel
        )
    except FileNotFoundError:
        run.not_found()
        return
    finally:
        if run.state_file is not None:
            await blocking(ctx, run.cleanup)
    run.conclude(ended)


class _ScriptRun:
    """One visit of a script node: what runs, with which environment, and the one
    :class:`ScriptFinished` that says how it went."""

    def __init__(self, task: ScriptTask, ctx: EffectContext, tmp_dir: Path | None) -> None:
        self.task = task
        self.ctx = ctx
        self.tmp_dir = tmp_dir
        self.started = time.monotonic()
        self.env: dict[Any, Any] = {}
        self.runtime: list[str] = []
        self.script_hash: str | None = None
        self.state_file: Path | None = None

    def finish(self, **fields: object) -> None:
        task = self.task
        if self.script_hash is not None:
            fields.setdefault("script_hash", self.script_hash)
        self.ctx.record(
            ScriptFinished(
                node_id=task.node_id,
                visit=task.visit,
                script=task.script,
                input_hash=content_hash(task.state_json),
                duration_ms=round((time.monotonic() - self.started) * 1000, 3),
                **fields,  # type: ignore[arg-type]
            )
        )

    def prepare(self) -> list[str] | None:
        """Read the script and set up its environment (its state inline, or in a
        file): the command to run, or None when it cannot run (recorded)."""
        task, ctx = self.task, self.ctx
        loaded = _load(ctx.agent_dir, task.script)
        if isinstance(loaded, str):
            self.finish(error=loaded)
            return None
        real_path, self.runtime, script_bytes = loaded
        self.script_hash = content_hash(script_bytes)
        env = script_env(
            _script_env(),
            agent_dir=ctx.agent_dir,
            config_dir=_config_dir(ctx),
            script=script_bytes,
            variables=getattr(getattr(ctx, "options", None), "variables", None),  # the run's
        )
        if len(task.state_json.encode("utf-8")) <= INLINE_STATE_LIMIT:
            _set(env, "GRAPH_STATE", task.state_json)
        else:
            directory = self.tmp_dir or Path(tempfile.gettempdir())
            directory.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f"{task.node_id}-", suffix=".json", dir=directory)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(task.state_json)
            self.state_file = Path(name)
            _set(env, "GRAPH_STATE_FILE", name)
        self.env = env
        return [*self.runtime, real_path]

    def not_found(self) -> None:
        self.finish(error=f"cannot run {self.task.script}: '{self.runtime[0]}' is not on PATH")

    def cleanup(self) -> None:
        """Remove the state file (one in the run's scratch directory goes with it)."""
        if self.state_file is not None and self.tmp_dir is None:
            with contextlib.suppress(OSError):
                self.state_file.unlink()

    def conclude(self, ended: process.Finished) -> None:
        """Record how the script ended: its output object, or why there is none."""
        task, finish = self.task, self.finish
        stdout = ended.stdout[:_OUTPUT_LIMIT].decode("utf-8", errors="replace")
        stderr = ended.stderr[-_OUTPUT_LIMIT:].decode("utf-8", errors="replace")
        code = ended.returncode
        if ended.timed_out:
            finish(
                stdout=stdout,
                stderr=stderr,
                timed_out=True,
                error=f"script timed out after {task.timeout:g}s",
            )
            return
        if self.ctx.cancel.cancelled:
            finish(
                stdout=stdout, stderr=stderr, error=f"script cancelled ({self.ctx.cancel.reason})"
            )
            return
        if code != 0:
            tail = stderr.strip().splitlines()[-1:] if stderr.strip() else []
            detail = f": {tail[0]}" if tail else ""
            finish(
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
                exit_code=code,
                stdout=stdout,
                stderr=stderr,
                error=f"script output is not valid JSON ({exc.msg} at line {exc.lineno})",
            )
            return
        if not isinstance(value, dict):
            finish(
                exit_code=code,
                stdout=stdout,
                stderr=stderr,
                error=f"script output must be a JSON object, got {type(value).__name__}",
            )
            return
        finish(exit_code=code, output=value, stderr=stderr)


class ScriptActor:
    """The ``script`` node actor."""

    node_type = "script"

    def __init__(self, tmp_dir: Path | None = None) -> None:
        self.tmp_dir = tmp_dir

    async def run(self, task: ScriptTask, ctx: EffectContext) -> None:
        await run_script_async(task, ctx, tmp_dir=self.tmp_dir)
