"""The ``input`` and ``approval`` node actor: get an answer from a person, record who.

An answer comes from ``--answer NODE=VALUE`` (in the order given, so a node
visited twice takes the next one), else from the terminal when there is one;
otherwise the run waits (:class:`WaitingForHumanSignal`) and ``graphrun approve`` /
``answer`` supply it later.
"""

from __future__ import annotations

from collections.abc import Callable

from graphrun.actors.base import EffectContext
from graphrun.actors.messages import HumanTask
from graphrun.eventstore.errors import GraphrunError
from graphrun.eventstore.events import HumanInputReceived


class AnswerRefused(GraphrunError):
    """An identity that is not among a node's approvers tried to answer."""


def check_approver(task_approvers: tuple[str, ...] | list[str], by: str, node_id: str) -> None:
    if task_approvers and by not in task_approvers:
        raise AnswerRefused(
            f"'{by}' may not answer approval '{node_id}'",
            hint=f"approvers: {', '.join(task_approvers)}",
        )


class HumanActor:
    """Asks, or takes a supplied answer, and records ``HumanInputReceived``."""

    node_type = "human"

    def __init__(
        self,
        answers: dict[str, list[str]],
        as_user: str | None,
        interactive: bool,
        on_wait: Callable[[HumanTask], BaseException],
    ) -> None:
        self.answers = answers
        self.as_user = as_user
        self.interactive = interactive
        self.on_wait = on_wait

    def perform(self, task: HumanTask, ctx: EffectContext) -> None:
        from graphrun.actors.human import ask_choice, ask_text, identity

        ident = identity(self.as_user)
        queued = self.answers.get(task.node_id)
        if queued:
            check_approver(task.approvers, ident.by, task.node_id)
            text, channel = queued.pop(0), "flag"
        elif self.interactive:
            check_approver(task.approvers, ident.by, task.node_id)
            if task.kind == "approval":
                answer = ask_choice(task.question, list(task.options))
            else:
                answer = ask_text(task.question, default=task.default)
            text, channel = answer.text, answer.channel
        else:
            raise self.on_wait(task)
        ctx.record(
            HumanInputReceived(
                node_id=task.node_id,
                visit=task.visit,
                answer=text,
                by=ident.by,
                os_user=ident.os_user,
                host=ident.host,
                channel=channel,
                question=task.question,
                options=list(task.options),
            )
        )
