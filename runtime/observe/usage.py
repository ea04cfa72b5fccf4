"""Token usage and cost of a run: the engine's :mod:`graphrun.runtime.engine.usage`
(the run budget is a policy the driver applies), under the name readers look for."""

from __future__ import annotations

from graphrun.runtime.engine.usage import (
    BUILTIN_PRICES,
    Usage,
    budget_breach,
    call_tokens,
    call_usage,
    format_cost,
    format_usage,
    load_prices,
    run_usage,
    tree_usage,
)

__all__ = [
    "BUILTIN_PRICES",
    "Usage",
    "budget_breach",
    "call_tokens",
    "call_usage",
    "format_cost",
    "format_usage",
    "load_prices",
    "run_usage",
    "tree_usage",
]
