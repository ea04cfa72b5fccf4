"""graphrun's requests, as a LiteLLM proxy sees them: a real ``litellm --config`` on
127.0.0.1 with ``mock_response`` models (no provider, no key, no internet).

    pip install 'litellm[proxy]'
    python bench/litellm_check.py

LiteLLM may also live in a venv of its own (it is large); the proxy is found on
``PATH``::

    python3 -m venv /tmp/litellm-venv && /tmp/litellm-venv/bin/pip install 'litellm[proxy]'
    PATH=/tmp/litellm-venv/bin:$PATH .venv/bin/python bench/litellm_check.py
    PATH=/tmp/litellm-venv/bin:$PATH .venv/bin/python -m pytest tests/integration/test_litellm.py

Three runs go through the proxy: an ordinary chat model, and OpenAI reasoning
models (``o3``, ``gpt-5``) from a graph that sets ``temperature`` and ``top_p``;
LiteLLM refuses sampling parameters for those (``UnsupportedParamsError``), so the
runs pass only because graphrun's per-model rules leave them out. Exit 0 when every
run completes with the mocked answer.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

MODELS = {
    "gpt-4o-mini": "chat answer from litellm",
    "o3": "reasoned answer from litellm",
    "gpt-5": "gpt-5 answer from litellm",
}


# The proxy's key, also graphrun's client key (config.yaml says {{LITELLM_MASTER_KEY}}).
MASTER_KEY = "sk-graphrun-litellm-check-0123456789"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def litellm_command() -> list[str] | None:
    """How to start the proxy here, or None when LiteLLM is not installed."""
    exe = Path(sys.executable).with_name("litellm")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("litellm")
    return [found] if found else None


def start_proxy(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    command = litellm_command()
    if command is None:
        raise SystemExit("litellm is not installed: pip install 'litellm[proxy]'")
    entries = "".join(
        f"  - model_name: {name}\n"
        f"    litellm_params:\n"
        f"      model: openai/{name}\n"
        f"      api_key: sk-not-used\n"
        f'      mock_response: "{answer}"\n'
        for name, answer in MODELS.items()
    )
    config = workdir / "litellm.yaml"
    config.write_text(f"model_list:\n{entries}")
    port = _free_port()
    env = {
        **os.environ,
        "LITELLM_MASTER_KEY": MASTER_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "NO_DOCS": "True",
    }
    with (workdir / "litellm.log").open("wb") as log:  # the child keeps its own copy
        proc = subprocess.Popen(
            [*command, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    deadline = time.monotonic() + 120
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise SystemExit(
                    "litellm did not start:\n" + (workdir / "litellm.log").read_text()[-2000:]
                ) from None
            time.sleep(0.25)
    return proc, f"http://127.0.0.1:{port}/v1"


def run_graph(workdir: Path, base_url: str, model: str) -> tuple[int, str, str]:
    config_dir = workdir / "config"
    config_dir.mkdir(exist_ok=True)
    (config_dir / "config.yaml").write_text(
        "clients:\n"
        "  - type: openai-compatible\n"
        "    name: litellm\n"
        f"    api_base: {base_url}\n"
        "    api_key: '{{LITELLM_MASTER_KEY}}'\n"
    )
    agent = workdir / f"ask-{model}"
    agent.mkdir(exist_ok=True)
    (agent / "graph.yaml").write_text(
        textwrap.dedent(
            f"""\
            name: ask
            version: "1.0"
            model: litellm:{model}
            temperature: 0.3
            top_p: 0.9
            start: ask
            nodes:
              ask:
                type: llm
                prompt: "{{{{initial_prompt}}}}"
                state_updates:
                  answer: "{{{{output}}}}"
                next: done
              done:
                type: end
                output: "{{{{answer}}}}"
            """
        )
    )
    env = {
        **os.environ,
        "GRAPHRUN_CONFIG_DIR": str(config_dir),
        "GRAPHRUN_DB": str(workdir / "events.db"),
        "LITELLM_MASTER_KEY": MASTER_KEY,  # the client's api_key is {{LITELLM_MASTER_KEY}}
        "NO_PROXY": "127.0.0.1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "graphrun.cli", "run", str(agent), "Say something."],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return proc.returncode, proc.stdout.strip(), proc.stderr.strip()


def check() -> list[tuple[str, bool, str]]:
    """``(model, passed, detail)`` per model."""
    with tempfile.TemporaryDirectory(prefix="graphrun-litellm-") as tmp:
        workdir = Path(tmp)
        proc, base_url = start_proxy(workdir)
        try:
            rows = []
            for model, answer in MODELS.items():
                code, out, err = run_graph(workdir, base_url, model)
                ok = code == 0 and out == answer
                rows.append((model, ok, out if ok else (err.splitlines() or [""])[-1]))
            return rows
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    rows = check()
    for model, ok, detail in rows:
        print(f"{'ok ' if ok else 'BAD'} {model:<12} {detail}")
    return 0 if all(ok for _m, ok, _d in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
