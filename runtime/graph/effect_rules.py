"""Validation rules that need the effect layer across a graph's nodes: the graph's
MCP servers, the models its nodes call. (What concerns one node kind alone, its
tools or its knowledge base, is a rule of that kind, in its module.)

They are registered with :func:`graphrun.runtime.graph.check.register_rule` and marked
``deep`` (``Check(deep=False)`` skips them).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from graphrun.eventstore.errors import GraphrunError
from graphrun.runtime.graph.check import Check, register_rule
from graphrun.runtime.graph.check import node_path as _npath
from graphrun.runtime.graph.loader import Diagnostic


def deep(fn):  # type: ignore[no-untyped-def]
    fn.deep = True
    return fn


@register_rule
@deep
def mcp_servers_known(c: Check) -> list[Diagnostic]:
    """Each graph-level ``mcp_servers`` entry must be a server in ``functions/mcp.json``."""
    if not c.graph.mcp_servers:
        return []
    from graphrun.actors.tools.mcp import load_mcp_config

    try:
        configured = load_mcp_config(c.config_dir)
    except GraphrunError as exc:
        return [c.diag("error", "mcp-config", str(exc), "$.mcp_servers")]
    where = c.config_dir / "functions" / "mcp.json" if c.config_dir else "functions/mcp.json"
    out = []
    for i, server in enumerate(c.graph.mcp_servers):
        if server in configured:
            continue
        close = difflib.get_close_matches(server, list(configured), n=1)
        if close:
            hint = f"did you mean '{close[0]}'?"
        elif configured:
            hint = f"configured: {', '.join(sorted(configured))}"
        else:
            hint = f"add it to {where}"
        out.append(
            c.diag(
                "error",
                "unknown-mcp-server",
                f"MCP server '{server}' is not configured in {where}",
                f"$.mcp_servers[{i}]",
                hint=hint,
            )
        )
    return out


@register_rule
@deep
def llm_models_known(c: Check) -> list[Diagnostic]:
    """Each llm node's model (or the graph's default) must resolve to a provider or client."""
    from graphrun.actors.llm.config import load_llm_config

    nodes = [(nid, n) for nid, n in c.nodes() if type(n).CALLS_MODEL]
    if not nodes:
        return []
    try:
        config = load_llm_config(c.config_dir)
    except GraphrunError as exc:
        return [c.diag("error", "llm-config", str(exc), "$")]
    out = []
    for nid, node in nodes:
        own = getattr(node, "model", None)
        model = own or c.graph.model
        where = _npath(nid, "model") if own else "$.model"
        if not model:
            out.append(
                c.diag(
                    "error",
                    "no-model",
                    f"llm node '{nid}' has no model and the graph sets none",
                    _npath(nid),
                    node=nid,
                    hint="set model: provider:model on the node or graph",
                )
            )
            continue
        try:
            config.resolve(model)
        except GraphrunError as exc:
            out.append(
                c.diag("error", "unknown-model", f"llm node '{nid}': {exc}", where, node=nid)
            )
            continue
        problem = _unlisted_model(config, model)
        if problem is not None:
            severity, message, hint = problem
            out.append(
                c.diag(
                    severity,
                    "unknown-model",
                    f"llm node '{nid}': {message}",
                    where,
                    node=nid,
                    hint=hint,
                )
            )
    return out


def _unlisted_model(config: Any, model_id: str) -> tuple[str, str, str] | None:
    """A model no table nor client lists: an error for a ``name:variant`` (it would
    reach the server as a literal id), a warning when the configuration's own
    models.yaml lists the provider's models and not this one."""
    import difflib

    name, _, model = model_id.partition(":")
    client = config.client(name)
    if model in client.models or config.model_info(client, model) is not None:
        return None
    listed = sorted(
        {
            *client.models,
            *(
                m
                for provider in (client.name, client.kind, "claude")
                for m in config.models.get(provider, {})
                if provider != "claude" or client.provider == "anthropic"
            ),
        }
    )
    near = difflib.get_close_matches(model, listed, n=1, cutoff=0.6)
    hint = (
        f"did you mean '{name}:{near[0]}'?"
        if near
        else ("list it in the config directory's models.yaml, or under the client's models:")
    )
    if ":" in model:
        return (
            "error",
            f"model '{model_id}' is in no models table nor client '{client.name}''s models, "
            "so its variant would be sent as a literal model id",
            hint,
        )
    if (
        config.source
        and listed
        and any(
            (Path(config.source).parent / f).is_file()
            for f in ("models.yaml", "models-override.yaml")
        )
    ):
        return ("warning", f"model '{model_id}' is in no models table of the configuration", hint)
    return None
