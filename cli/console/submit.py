"""Starting a run from the console's API, as ``graphrun submit`` / ``run`` do.

Only agents of the agents directory can be named (never a path: an API caller
must not make the server run a graph file of its choosing). On PostgreSQL the run
is queued for workers (``graphrun submit``); on SQLite it is driven in this
process, in a thread of its own (``graphrun run``).
"""

from __future__ import annotations

import re
import threading
from typing import Any

from graphrun.runtime.errors import UsageError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def submit(
    db: str, *, agent: str, prompt: str, state: dict[str, Any], principal: str
) -> tuple[str, str]:
    """Start a run of ``agent``; returns ``(run_id, "queued" | "running")``."""
    from graphrun.cli.options import open_store
    from graphrun.runtime.agents import load_agent
    from graphrun.runtime.engine.driver import RunOptions, start_run
    from graphrun.runtime.graph.config import agents_dir as resolve_agents
    from graphrun.runtime.graph.config import config_dir as resolve_config
    from graphrun.runtime.graph.config import resolve_agent
    from graphrun.runtime.graph.preflight import preflight
    from graphrun.runtime.graph.variables import resolve as resolve_variables
    from graphrun.runtime.graph.variables import with_variables

    if not _NAME.match(agent) or ".." in agent:
        raise UsageError(f"agent {agent!r}: name an agent of the agents directory")
    if not isinstance(state, dict):
        raise UsageError("set: expected an object of state keys")
    cfg = resolve_config(None)
    agents = resolve_agents(None, config=cfg)
    loaded = load_agent(resolve_agent(agent, agents), config_dir=cfg)
    variables = resolve_variables(loaded, {})
    loaded = with_variables(loaded, variables)
    options = RunOptions(agents_dir=agents, config_dir=cfg, as_user=principal)
    options.variables = variables
    options.interactive = False
    preflight(loaded, options)
    store = open_store(db, create=True)
    if hasattr(store, "claim"):
        from graphrun.runtime.engine.workers import submit_run

        try:
            run_id = submit_run(
                store,
                loaded,
                prompt=prompt,
                overrides=dict(state),
                as_user=principal,
                agents_dir=agents,
                config_dir=cfg,
                config={"variables": variables},
            )
        finally:
            store.close()
        return run_id, "queued"
    from graphrun.runtime.engine.driver import Driver, drive, run_config

    run_id = start_run(
        store,
        loaded,
        prompt=prompt,
        overrides=dict(state),
        started_by=principal,
        config=run_config(loaded, options),
    )

    def go() -> None:
        try:
            drive(Driver(store, run_id, options))
        finally:
            store.close()

    threading.Thread(target=go, name=f"run-{run_id}", daemon=True).start()
    return run_id, "running"


__all__ = ["submit"]
