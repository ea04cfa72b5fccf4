"""The ``input`` and ``approval`` node actor: get an answer from a person, record who.

An answer comes from ``--answer NODE=VALUE`` (in the order given, so a node
visited twice takes the next one; for an approval, an option or its number) or
``--other NODE=TEXT`` (an approval's free-form answer), else from the terminal
when there is one;
otherwise the run waits (the ``on_wait`` exception) and ``graphrun approve`` /
``answer`` supply it later.

A supplied choice that names no option is refused the same way as an answer
from someone who may not give it. An approval node may list ``approvers``. An
answer from anyone else is refused
before it is recorded (and a person who may not answer is not asked): the run is
left waiting at the node, nothing about the refused answer enters the log, and
the driver returns the refusal with the waiting outcome (``RunOutcome.refused``),
and the command reports it and exits with its code (2). A prompt the person interrupts
(Ctrl-C, Ctrl-D) leaves the run waiting the same way (exit 130).

A question on the terminal hears the visit's token: the run's timeout, a
``graphrun cancel`` or a SIGTERM closes the prompt at once, nothing is recorded
for it, and the run ends as that says (timed out, cancelled, interrupted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from graphrun.actors.base import EffectContext
from graphrun.actors.messages import HumanTask
from graphrun.eventstore.errors import GraphrunError

__all__ = ["AnswerRefused", "HumanActor", "check_approver"]


class AnswerRefused(GraphrunError):
    """An identity that is not among a node's approvers tried to answer it."""


def check_approver(approvers: Sequence[str], by: str, node_id: str, *, how: str = "") -> None:
    """Refuse ``by`` unless the node lists no approvers or lists ``by``.

    Args:
        approvers: The node's ``approvers`` (empty: anyone may answer).
        by: The answering identity (``--as``, else the OS user).
        node_id: The approval node, for the message.
        how: How to answer as someone else, for the hint (e.g. "pass --as NAME").

    Raises:
        AnswerRefused: ``by`` is not an approver.
    """
    if approvers and by not in approvers:
        hint = f"approvers: {', '.join(approvers)}"
        if how:
            hint = f"{hint}; {how}"
        raise AnswerRefused(f"'{by}' may not answer approval node '{node_id}'", hint=hint)


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
        """Record the answer to ``task``, or raise ``on_wait(task)`` to leave the run waiting."""
        from graphrun.actors.human.prompt import (
            HumanInputCancelled,
            HumanInputError,
            identity,
        )

        queued = self.answers.get(task.node_id)
        if not queued and (not self.interactive or task.signed):
            raise self.on_wait(task)
        try:
            if task.signed:
                raise AnswerRefused(
                    f"node '{task.node_id}' requires a signed answer; --answer and --other "
                    "cannot give one",
                    hint="graphrun approve RUN CHOICE --sign KEY (or graphrun answer ... --sign)",
                )
            ident = identity(self.as_user)
            # Checked before asking: nobody is asked a question they may not answer.
            check_approver(task.approvers, ident.by, task.node_id, how="pass --as NAME")
            if queued:
                answer, channel = self._queued(task, queued[0]), "flag"
                queued.pop(0)
            else:
                answer, channel = self._ask(task, ctx)
        except HumanInputCancelled as withdrawn:
            # Not a refusal: the run is ending (timed out, cancelled, interrupted).
            raise GraphrunError(f"cancelled ({ctx.cancel.reason or withdrawn})") from None
        except (AnswerRefused, HumanInputError) as refused:
            # The run waits; the driver reports the refusal (RunOutcome.refused).
            raise self.on_wait(task) from refused
        ctx.record(ident.answered(task, answer, channel))

    @staticmethod
    def _queued(task: HumanTask, given: str) -> str:
        """A supplied answer as recorded: an approval's option by name or number, or
        free-form text given as such (``--other``); anything else is refused."""
        from graphrun.actors.human.prompt import FreeForm, check_free_form, pick_option

        if task.kind != "approval":
            return str(given)
        if isinstance(given, FreeForm):
            return check_free_form(str(given), task.options, task.node_id)
        return pick_option(given, task.options, task.node_id)

    @staticmethod
    def _ask(task: HumanTask, ctx: EffectContext) -> tuple[str, str]:
        from graphrun.actors.human.prompt import ask_choice, ask_text

        cancel = getattr(ctx, "cancel", None)
        if task.kind == "approval":
            asked = ask_choice(task.question, list(task.options), cancel=cancel)
            return asked.text, asked.channel
        asked = ask_text(task.question, default=task.default, cancel=cancel)
        # An empty answer is recorded as given: the graph substitutes the default
        # itself, and does not validate a substituted default.
        return ("" if asked.defaulted else asked.text), asked.channel
