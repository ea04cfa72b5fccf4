"""``map`` nodes: run one branch node once per item of a list, concurrently.

::

    fan:
      type: map
      over: "{{items}}"          # exactly one {{path}} resolving to a JSON array
      as: item                   # the key each item is put under inside its branch
      branch: summarise          # an llm, agent, rag, script or tool node
      collect_into: summaries    # the list of results, in input order
      next: report

A map is control flow: the decider runs its items as a super-step (there is no
``KIND``), so this module holds its Struct and its validation rules.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from graphrun.runtime.graph.check import node_path
from graphrun.runtime.graph.model import ItemBranch, NodeBase


class MapNode(NodeBase, tag="map", kw_only=True):
    """Runs ``branch`` once per item of the list ``over`` resolves to, concurrently.

    Each item runs against the step's snapshot with the item under ``as``; the
    items' results are collected, in input order, into ``collect_into``."""

    over: str
    as_: str = msgspec.field(name="as")
    branch: str
    collect_into: str
    output_key: str = "output"
    max_concurrency: int | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Runs the `branch` node once per item of a list, concurrently, and collects "
        "the results in input order.",
        "over": "Exactly one {{path}} that resolves to a JSON array (required).",
        "as": "The state key each item is put under inside its branch (required).",
        "branch": "The id of the llm, agent, rag or script node run per item (required).",
        "collect_into": "The state key that receives the list of results (required).",
        "output_key": "Which key of a branch's result is collected (default output).",
        "max_concurrency": "How many items run at once (default: settings.max_concurrency).",
        "next": "Where to go once every item is done (required).",
    }
    NEEDS_NEXT: ClassVar[bool] = True
    MAP_BRANCH: ClassVar[bool] = False
    MAP_BRANCH_PROBLEM: ClassVar[str | None] = "nested map fan-outs are not supported"

    def body_edges(self) -> list[tuple[str, str]]:
        return [("branch", self.branch)]

    def per_item(self) -> ItemBranch:
        return ItemBranch(self.branch, self.as_, self.collect_into)

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("over", self.over)]

    def rules(self, node_id: str, check: Any) -> list[Any]:
        out = super().rules(node_id, check)
        cap = self.max_concurrency
        if cap is not None and cap < 1:
            out.append(
                check.diag(
                    "error",
                    "max-concurrency",
                    f"map node '{node_id}': max_concurrency must be >= 1 (got {cap})",
                    node_path(node_id, "max_concurrency"),
                    node=node_id,
                )
            )
        return out + self._branch_rules(node_id, check)

    def _branch_rules(self, nid: str, c: Any) -> list[Any]:
        """The branch is one node that may run per item and writes only ``output_key``."""
        branch = c.graph.nodes.get(self.branch)
        if branch is None:
            return []  # the edge rule reports an unknown target
        bad = type(branch).MAP_BRANCH_PROBLEM
        if bad is not None:
            return [
                c.diag(
                    "error",
                    "map-branch",
                    f"map node '{nid}': branch '{self.branch}': {bad}",
                    node_path(nid, "branch"),
                    node=nid,
                )
            ]
        out = []
        if branch.next is not None:
            out.append(
                c.diag(
                    "error",
                    "map-branch",
                    f"map branch '{self.branch}' has a `next` declared: map branches must be "
                    "atomic (one node, one run per item)",
                    node_path(self.branch, "next"),
                    node=self.branch,
                    hint=f"chain after the map: put it in map node '{nid}''s next",
                )
            )
        for key in sorted(branch.state_updates):
            if key != self.output_key:
                out.append(
                    c.diag(
                        "error",
                        "map-branch",
                        f"map branch '{self.branch}' writes '{key}': map branches may only "
                        f"write through their `output_key` ('{self.output_key}')",
                        node_path(self.branch, "state_updates", key),
                        node=self.branch,
                    )
                )
        schema = getattr(branch, "output_schema", None)
        if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
            props = ", ".join(sorted(schema["properties"]))
            out.append(
                c.diag(
                    "error",
                    "map-branch",
                    f"map branch '{self.branch}' has an `output_schema` with top-level "
                    f"properties ({props}): map branches write only through their `output_key`",
                    node_path(self.branch, "output_schema"),
                    node=self.branch,
                )
            )
        return out


#: Registered by the kind registry (``graphrun.runtime.nodes``) with the other kinds.
STRUCT = MapNode
