"""``approval`` and ``input`` nodes: the run waits for a person's answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import msgspec

from graphrun.actors.human.prompt import parse_validation
from graphrun.actors.messages import HumanTask
from graphrun.eventstore.events import HumanInputReceived, HumanInputRequested, NodeCompleted
from graphrun.eventstore.fold import RunState
from graphrun.runtime.errors import WaitingForHuman
from graphrun.runtime.graph.check import node_path
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import Graph, NodeBase, Route
from graphrun.runtime.graph.routing import pick_route
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import Append, Perform, Step, fail

if TYPE_CHECKING:
    from graphrun.runtime.nodes.ports import RunPorts


class Approvals(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``approvals:`` of an approval node: how many distinct signers, out of whom."""

    required: int
    of: list[str]

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "graphrun extension: several distinct signers must give the same answer.",
        "required": "How many distinct signers (at least 1, at most the length of `of`).",
        "of": "The principals (of the allowed_signers file) who may sign.",
    }


class ApprovalNode(NodeBase, tag="approval", kw_only=True):
    question: str
    options: list[str]
    on_other: str
    routes: dict[str, str] = msgspec.field(default_factory=dict)
    # Extension: only these identities may answer.
    approvers: list[str] | None = None
    # Extension: answers here must be signed (overrides settings.signed_decisions).
    signed_decisions: Literal["required", "optional"] | None = None
    # Extension: the run continues once this many distinct signers gave one answer.
    approvals: Approvals | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Asks a person to pick one of the options (or answer in their own words) "
        "and routes on the answer.",
        "question": "The question; templated, strict.",
        "options": "The options shown, in order (answers may give an option's 1-based number).",
        "routes": "Map of option -> node id: where each option routes.",
        "on_other": "Where a free-form answer (one that is no option) routes; required. "
        "Its text is {{choice}}.",
        "approvers": "graphrun extension: only these identities may answer (principals of "
        "the allowed_signers file when answers are signed; else the --as name).",
        "signed_decisions": "graphrun extension: `required` or `optional`; overrides "
        "settings.signed_decisions for this node.",
        "approvals": "graphrun extension: {required: N, of: [principals]}: the run waits "
        "until N distinct signers gave the same answer.",
        "next": "Ignored: approval nodes route with routes and on_other.",
        "state_updates": "Map of state key -> template; {{choice}} is the picked option "
        "or the free-form text.",
    }
    HUMAN: ClassVar[bool] = True
    MAP_BRANCH: ClassVar[bool] = False
    MAP_BRANCH_PROBLEM: ClassVar[str | None] = (
        "an approval node cannot run inside a parallel map branch"
    )
    SCOPED: ClassVar[str] = "choice"

    def static_edges(self) -> list[tuple[str, str]]:
        # `next` is ignored on approval nodes (routing is routes + on_other), but where
        # a skipped one (``if``/``unless``) goes.
        edges = [(f"routes.{key}", target) for key, target in self.routes.items()]
        edges.append(("on_other", self.on_other))
        if self.if_ is not None or self.unless is not None:
            edges.extend(
                (f"next[{i}]" if isinstance(self.next, list) else "next", target)
                for i, target in enumerate(self.targets)
            )
        return edges

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("question", self.question)]

    def rules(self, node_id: str, check: Any) -> list[Any]:
        return super().rules(node_id, check) + self._option_rules(node_id, check)

    def _option_rules(self, nid: str, c: Any) -> list[Any]:
        """Every option routes somewhere; every route is an option; there are options."""
        out = []
        if self.next is not None and self.if_ is None and self.unless is None:
            out.append(
                c.diag(
                    "warning",
                    "approval-next-ignored",
                    f"approval '{nid}': `next` is ignored (an approval routes by its "
                    "answer: routes and on_other)",
                    node_path(nid, "next"),
                    node=nid,
                    hint="route each option under routes, free-form answers with on_other",
                )
            )
        for i, option in enumerate(self.options):
            if option not in self.routes:
                out.append(
                    c.diag(
                        "error",
                        "option-without-route",
                        f"approval '{nid}': option '{option}' has no routes entry",
                        node_path(nid, "options") + f"[{i}]",
                        node=nid,
                        hint=f"add routes: {{'{option}': <node>}}",
                    )
                )
        for key in self.routes:
            if key not in self.options:
                out.append(
                    c.diag(
                        "warning",
                        "route-without-option",
                        f"approval '{nid}': routes entry '{key}' matches no option",
                        node_path(nid, "routes", key),
                        node=nid,
                    )
                )
        if not self.options:
            out.append(
                c.diag(
                    "error",
                    "no-options",
                    f"approval '{nid}' has no options",
                    node_path(nid, "options"),
                    node=nid,
                )
            )
        return out


class InputNode(NodeBase, tag="input", kw_only=True):
    routes: list[Route] = msgspec.field(default_factory=list)
    question: str
    default: str | None = None
    validation: str | None = None
    # Extension: only these identities may answer.
    approvers: list[str] | None = None
    # Extension: answers here must be signed (overrides settings.signed_decisions).
    signed_decisions: Literal["required", "optional"] | None = None

    DESCRIPTIONS: ClassVar[dict[str | None, str]] = {
        None: "Asks a person for a line of free text.",
        "question": "The question; templated, strict.",
        "default": "Taken when the answer is empty; templated. Not validated.",
        "validation": "A length rule `len(input) <op> <integer>` with <op> one of >, >=, "
        "<, <=, ==. An answer that fails it is refused and the run keeps waiting.",
        "approvers": "graphrun extension: only these identities may answer.",
        "signed_decisions": "graphrun extension: `required` or `optional`; overrides "
        "settings.signed_decisions for this node.",
        "next": "Where to go with the answer (required; of a list only the first entry is used).",
        "state_updates": "Map of state key -> template; {{input}} is the answer (or the default).",
    }
    NEEDS_NEXT: ClassVar[bool] = True
    HUMAN: ClassVar[bool] = True
    MAP_BRANCH: ClassVar[bool] = False
    MAP_BRANCH_PROBLEM: ClassVar[str | None] = (
        "an input node cannot run inside a parallel map branch"
    )
    SCOPED: ClassVar[str] = "input"

    def strict_fields(self) -> list[tuple[str, object]]:
        return [("question", self.question)]

    def template_fields(self) -> list[object]:
        return [self.question, self.default]

    def rules(self, node_id: str, check: Any) -> list[Any]:
        out = super().rules(node_id, check)
        if self.validation is not None:
            try:
                parse_validation(self.validation)
            except ValueError as exc:
                out.append(
                    check.diag(
                        "error",
                        "validation-grammar",
                        str(exc),
                        node_path(node_id, "validation"),
                        node=node_id,
                    )
                )
        return out


def human_task(
    graph: Graph, node: ApprovalNode | InputNode, node_id: str, visit: int, s: dict[str, Any]
) -> HumanTask:
    from graphrun.runtime.decisions.policy import policy_of

    policy = policy_of(graph, node_id)
    question = render(node.question, s, strict=True, field=f"{node_id}.question")
    if isinstance(node, ApprovalNode):
        return HumanTask(
            node_id,
            visit,
            "approval",
            question,
            tuple(node.options),
            approvers=policy.approvers,
            signed=policy.signed,
        )
    default = (
        render(node.default, s, strict=True, field=f"{node_id}.default")
        if node.default is not None
        else None
    )
    return HumanTask(
        node_id,
        visit,
        "input",
        question,
        default=default,
        approvers=policy.approvers,
        signed=policy.signed,
    )


def request(graph: Graph, node: ApprovalNode | InputNode, node_id: str, state: RunState) -> Step:
    """The question is recorded first (the run then waits); then the answer is asked for."""
    task = human_task(graph, node, node_id, state.current_visit, state.state)
    if state.waiting is None:
        return Append(
            (
                HumanInputRequested(
                    node_id=node_id,
                    visit=state.current_visit,
                    kind=task.kind,
                    question=task.question,
                    options=list(task.options),
                    default=task.default,
                    approvers=list(task.approvers),
                    signed=task.signed,
                ),
            )
        )
    return Perform(node_id, task.kind, task)


def match_choice(node: ApprovalNode, answer: str) -> str | None:
    """The routes key an answer selects, or None for a free-form answer."""
    text = answer.strip()
    if text in node.routes:
        return text
    folded = [key for key in node.routes if key.casefold() == text.casefold()]
    return folded[0] if len(folded) == 1 else None


def complete_approval(
    graph: Graph, node: ApprovalNode, node_id: str, state: RunState, answer: HumanInputReceived
) -> Step:
    key = match_choice(node, answer.answer)
    choice = key if key is not None else answer.answer
    routed = node.routes[key] if key is not None else node.on_other
    updates = render_updates(node.state_updates, state.state, {"choice": choice})
    return Append(
        (
            NodeCompleted(
                node_id=node_id, visit=state.current_visit, routed_to=routed, updates=updates
            ),
        )
    )


def complete_input(
    graph: Graph, node: InputNode, node_id: str, state: RunState, answer: HumanInputReceived
) -> Step:
    from graphrun.actors.human.prompt import parse_validation

    s = state.state
    visit = state.current_visit
    text = answer.answer
    substituted = False
    if text.strip() == "" and node.default is not None:
        text = render(node.default, s, strict=True, field=f"{node_id}.default")
        substituted = True
    # The spec: a substituted default is not re-validated.
    if node.validation and not substituted:
        rule = parse_validation(node.validation)
        if not rule.check(text):
            return fail(
                node_id,
                visit,
                f"input failed validation '{node.validation}' (got {len(text)} characters)",
            )
    updates = render_updates(node.state_updates, s, {"input": text})
    # An input node routes to the first entry of a `next` list only (Loki).
    default = node.targets[0] if node.targets else None
    try:
        routed = pick_route(node, {**s, **updates}, default) if node.routes else default
    except ExpressionError as exc:
        return fail(node_id, visit, str(exc))
    if routed is None:
        return fail(node_id, visit, "input node has no next to route to")
    return Append((NodeCompleted(node_id=node_id, visit=visit, routed_to=routed, updates=updates),))


def _waiting(task: Any) -> BaseException:
    return WaitingForHuman(f"run waits for an answer at node '{task.node_id}'")


def effect(ports: RunPorts) -> tuple[type, tuple[Any, ...]]:
    from graphrun.actors.human.actor import HumanActor

    options = ports.options
    return HumanActor, (options.answers, options.as_user, options.interactive, _waiting)


APPROVAL = NodeKind(
    type="approval",
    struct=ApprovalNode,
    result=HumanInputReceived,
    request=request,
    complete=complete_approval,
    effect=effect,
    human=True,
)
INPUT = NodeKind(
    type="input",
    struct=InputNode,
    result=HumanInputReceived,
    request=request,
    complete=complete_input,
    effect=effect,
    human=True,
)
