"""Token usage and cost of a run, from its ``LlmCalled`` events, and run budgets.

Usage is what the provider reported on each call (``usage`` of ``LlmCalled``):
OpenAI's ``prompt_tokens``/``completion_tokens`` and Anthropic's
``input_tokens``/``output_tokens`` are read alike. Cost comes from a price table:
a few built-in models, extended or overridden by ``<config_dir>/config.yaml``,
either per model of a client (Loki's ``models.yaml`` shape)::

    clients:
      - type: openai-compatible
        name: ollama
        models:
          - name: llama
            input_price: 0.0      # USD per million input tokens
            output_price: 0.0

or as a table keyed by ``provider:model``::

    prices:
      openai:gpt-4o-mini: {input_price: 0.15, output_price: 0.6}

A model with no price has no cost (shown as unknown, never as zero).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import msgspec

from graphrun.eventstore.events import ChildRunStarted, Event, LlmCalled

#: USD per million tokens (input, output): public list prices; config.yaml overrides.
BUILTIN_PRICES: dict[str, tuple[float, float]] = {
    "openai:gpt-4o-mini": (0.15, 0.60),
    "openai:gpt-4o": (2.50, 10.00),
    "openai:gpt-4.1": (2.00, 8.00),
    "openai:gpt-4.1-mini": (0.40, 1.60),
    "openai:gpt-4.1-nano": (0.10, 0.40),
    "openai:o4-mini": (1.10, 4.40),
    "anthropic:claude-3-5-haiku-latest": (0.80, 4.00),
    "anthropic:claude-sonnet-4-0": (3.00, 15.00),
    "anthropic:claude-opus-4-0": (15.00, 75.00),
}


class Usage(msgspec.Struct, gc=False):
    """Tokens (and cost, when every priced model is known) of some LLM calls.

    A report keeps one per node visit (a map's 10,000 items: 10,000), so it holds
    only numbers and a shared frozenset: it can never be part of a reference cycle,
    and the cyclic collector need not walk it (``gc=False``)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    #: Models with no price (one shared frozenset per set of models).
    unpriced: frozenset[str] = frozenset()

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_known(self) -> bool:
        return not self.unpriced

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cost += other.cost
        if other.unpriced and not other.unpriced <= self.unpriced:
            self.unpriced = _models(self.unpriced | other.unpriced)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "cost_usd": round(self.cost, 8) if self.cost_known else None,
            "unpriced_models": sorted(self.unpriced),
        }


def call_tokens(usage: Mapping[str, Any]) -> tuple[int, int]:
    """``(input, output)`` tokens of one call's recorded ``usage``."""

    def num(*keys: str) -> int:
        for key in keys:
            value = usage.get(key)
            if isinstance(value, int | float):
                return int(value)
        return 0

    inp = num("prompt_tokens", "input_tokens")
    out = num("completion_tokens", "output_tokens")
    if not inp and not out:
        total = num("total_tokens")
        return total, 0
    return inp, out


@lru_cache(maxsize=256)
def _models(names: frozenset[str]) -> frozenset[str]:
    """One frozenset per set of model names (a call's usage is one of thousands)."""
    return names


def call_usage(event: LlmCalled, prices: Mapping[str, tuple[float, float]]) -> Usage:
    """The usage and cost of one recorded call."""
    inp, out = call_tokens(event.usage or {})
    u = Usage(calls=1, input_tokens=inp, output_tokens=out)
    price = prices.get(event.model)
    if price is None:
        if inp or out:
            u.unpriced = _models(frozenset((event.model or "<unknown model>",)))
    else:
        u.cost = (inp * price[0] + out * price[1]) / 1_000_000
    return u


class UsageTally:
    """A run's own usage, added up one recorded call at a time: the total and per node."""

    def __init__(self, prices: Mapping[str, tuple[float, float]] | None = None) -> None:
        self.prices = BUILTIN_PRICES if prices is None else prices
        self.total = Usage()
        self.per_node: dict[str, Usage] = {}

    def add(self, event: LlmCalled) -> None:
        u = call_usage(event, self.prices)
        self.total.add(u)
        self.per_node.setdefault(event.node_id, Usage()).add(u)


def run_usage(
    events: Iterable[Event], prices: Mapping[str, tuple[float, float]] | None = None
) -> tuple[Usage, dict[str, Usage]]:
    """A run's own usage (not its children's): the total and per node."""
    tally = UsageTally(prices)
    for event in events:
        if isinstance(event, LlmCalled):
            tally.add(event)
    return tally.total, tally.per_node


def tree_usage(
    store: Any, run_id: str, prices: Mapping[str, tuple[float, float]] | None = None
) -> Usage:
    """The usage of a run and of every run it started (agent nodes), recursively."""
    total = Usage()
    seen: set[str] = set()
    todo = [run_id]
    while todo:
        rid = todo.pop()
        if rid in seen:
            continue
        seen.add(rid)
        events = store.read(rid)
        own, _ = run_usage(events, prices)
        total.add(own)
        todo.extend(e.child_run_id for e in events if isinstance(e, ChildRunStarted))
    return total


def load_prices(config_dir: Path | str | None) -> dict[str, tuple[float, float]]:
    """The built-in price table extended by ``<config_dir>/config.yaml`` (if any).

    Raises:
        UsageError: a price in config.yaml that is not a number.
    """
    prices = dict(BUILTIN_PRICES)
    if config_dir is None:
        return prices
    path = Path(config_dir) / "config.yaml"
    if not path.is_file():
        return prices
    import yaml

    from graphrun.runtime.errors import UsageError

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read prices: {exc}") from exc
    if not isinstance(raw, dict):
        return prices

    def price(entry: Any, where: str) -> tuple[float, float] | None:
        if not isinstance(entry, dict):
            return None
        if "input_price" not in entry and "output_price" not in entry:
            return None
        values = []
        for key in ("input_price", "output_price"):
            value = entry.get(key, 0)
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise UsageError(f"{path} ({where}.{key}): a price must be a number, not {value!r}")
            values.append(float(value))
        return values[0], values[1]

    for i, client in enumerate(raw.get("clients") or []):
        if not isinstance(client, dict):
            continue
        defaults = {"openai": "openai", "claude": "claude", "anthropic": "anthropic"}
        name = client.get("name") or defaults.get(str(client.get("type", "")), "")
        for j, model in enumerate(client.get("models") or []):
            if isinstance(model, dict) and model.get("name"):
                found = price(model, f"clients[{i}].models[{j}]")
                if found is not None:
                    prices[f"{name}:{model['name']}"] = found
    table = raw.get("prices") or {}
    if isinstance(table, dict):
        for model_id, entry in table.items():
            found = price(entry, f"prices.{model_id}")
            if found is not None:
                prices[str(model_id)] = found
    return prices


def budget_breach(settings: Any, usage: Usage) -> str | None:
    """Why a run's usage exceeds its budget (``settings.max_tokens``/``max_cost``), or None."""
    max_tokens = getattr(settings, "max_tokens", None)
    if max_tokens is not None and usage.total_tokens > max_tokens:
        return (
            f"token budget exceeded: {usage.total_tokens} tokens used, "
            f"settings.max_tokens is {max_tokens}"
        )
    max_cost = getattr(settings, "max_cost", None)
    if max_cost is not None:
        if not usage.cost_known:
            models = ", ".join(sorted(usage.unpriced))
            return (
                f"cost budget cannot be checked: no price for {models} "
                "(settings.max_cost needs a price; add one under prices: in config.yaml)"
            )
        if usage.cost > max_cost:
            return (
                f"cost budget exceeded: {usage.cost:.6f} USD spent, "
                f"settings.max_cost is {max_cost:g} USD"
            )
    return None


# Per driver being checked: the price table, the last committed seq counted, and
# the usage of the committed events up to it (so each check reads only new events).
_BUDGET_STATE: WeakKeyDictionary[Any, tuple[Mapping[str, tuple[float, float]], int, Usage]] = (
    WeakKeyDictionary()
)


def driver_budget_breach(driver: Any) -> str | None:
    """The budget policy of a run being driven: checked after a node's effects.

    Costs nothing for a graph without a budget; otherwise sums the run's
    ``LlmCalled`` events, committed (read incrementally) and not yet committed.
    """
    settings = driver.graph.settings
    if (
        getattr(settings, "max_tokens", None) is None
        and getattr(settings, "max_cost", None) is None
    ):
        return None
    known = _BUDGET_STATE.get(driver)
    if known is None:
        prices: Mapping[str, tuple[float, float]] = BUILTIN_PRICES
        if getattr(settings, "max_cost", None) is not None:
            from graphrun.runtime.graph.config import config_dir

            prices = load_prices(driver.options.config_dir or config_dir(None))
        known = (prices, 0, Usage())
    prices, last, counted = known
    committed = driver.store.read(driver.run_id, after=last)
    if committed:
        new, _ = run_usage(committed, prices)
        counted = _sum(counted, new)
        last = committed[-1].seq
    _BUDGET_STATE[driver] = (prices, last, counted)
    pending = [e for e in driver.uncommitted() if e.seq > last]
    in_flight, _ = run_usage(pending, prices)
    return budget_breach(settings, _sum(counted, in_flight))


def _sum(a: Usage, b: Usage) -> Usage:
    total = Usage()
    total.add(a)
    total.add(b)
    return total


def format_cost(usd: float) -> str:
    """A cost in USD, the one way every view shows it: rounded to the millionth of a
    dollar, trailing zeros dropped, at least cents (``$0.00004``, ``$0.0012``, ``$1.50``)."""
    text = f"{round(usd, 6):.6f}".rstrip("0")
    whole, _, frac = text.partition(".")
    return f"${whole}.{frac.ljust(2, '0')}"


def format_usage(u: Usage) -> str:
    """``1234 tokens (1000 in, 234 out), 3 calls, $0.0012``."""
    cost = format_cost(u.cost) if u.cost_known else "cost unknown"
    return (
        f"{u.total_tokens} tokens ({u.input_tokens} in, {u.output_tokens} out), "
        f"{u.calls} call{'s' if u.calls != 1 else ''}, {cost}"
    )


__all__ = [
    "BUILTIN_PRICES",
    "Usage",
    "UsageTally",
    "budget_breach",
    "call_tokens",
    "call_usage",
    "driver_budget_breach",
    "format_cost",
    "format_usage",
    "load_prices",
    "run_usage",
    "tree_usage",
]
