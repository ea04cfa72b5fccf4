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
    env = script_env(
        env,
        agent_dir=ctx.agent_dir,
        config_dir=_config_dir(ctx),
        script=script_bytes,
        variables=getattr(getattr(ctx, "options", None), "variables", None),  # the run's
    )
    state_file: Path | None = None
    if len(task.state_json.encode("utf-8")) <= INLINE_STATE_LIMIT:
        _set(env, "GRAPH_STATE", task.state_json)
    else:
        directory = tmp_dir or Path(tempfile.gettempdir())
        directory.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{task.node_id}-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(task.state_json)
        state_file = Path(name)
        _set(env, "GRAPH_STATE_FILE", name)

    try:
        try:
            ended = process.run(
                [*runtime, real_path],
                env=env,
                cwd=work_dir(ctx.agent_dir),
                timeout=task.timeout,
                cancel=ctx.cancel,
            )
        except FileNotFoundError:
            finish(
                script_hash=script_hash,
                error=f"cannot run {task.script}: '{runtime[0]}' is not on PATH",
            )
            return
    finally:
        if state_file is not None and tmp_dir is None:
            with contextlib.suppress(OSError):
                state_file.unlink()
    stdout_b, stderr_b, timed_out = ended.stdout, ended.stderr, ended.timed_out
    stdout = stdout_b[:_OUTPUT_LIMIT].decode("utf-8", errors="replace")
    stderr = stderr_b[-_OUTPUT_LIMIT:].decode("utf-8", errors="replace")
    code = ended.returncode
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
