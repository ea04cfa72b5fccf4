"""``approval`` and ``input`` nodes: the run waits for a person's answer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from graphrun.actors.messages import HumanTask
from graphrun.eventstore.events import HumanInputReceived, HumanInputRequested, NodeCompleted
from graphrun.eventstore.fold import RunState
from graphrun.runtime.errors import WaitingForHuman
from graphrun.runtime.graph.expressions import ExpressionError
from graphrun.runtime.graph.model import ApprovalNode, Graph, InputNode
from graphrun.runtime.graph.routing import pick_route
from graphrun.runtime.graph.templates import render, render_updates
from graphrun.runtime.nodes.kind import NodeKind
from graphrun.runtime.nodes.plan import Append, Perform, Step, fail

if TYPE_CHECKING:
    from graphrun.runtime.nodes.ports import RunPorts


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
