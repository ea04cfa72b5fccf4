"""``user__*``: questions to a person, recorded as human input.

A question is recorded as ``HumanInputRequested`` of the ``llm`` node's visit
before anyone is asked: ``user__select`` and ``user__confirm`` as an ``approval``
(its options; ``confirm`` offers ``yes``/``no``: ``graphrun approve``), ``user__ask``
(options, or the person's own words), ``user__input`` and ``user__checkbox`` as an
``input`` (``graphrun answer``). On a terminal the person is asked there and
the answer recorded (``HumanInputReceived``, channel ``tty``); without one the
run waits (exit 3) until ``graphrun answer``/``approve`` records the answer, and
the resumed visit hands it to the model. ``user__checkbox``'s answer is the
chosen options separated by commas (or their numbers). In an agent another
model spawned (``agent__spawn``) nobody is asked: the run waits, and the model
that spawned it answers (``agent__reply_escalation``), as Loki escalates a
sub-agent's questions.
"""

from __future__ import annotations

from typing import Any

from graphrun.eventstore.events import HumanInputReceived, HumanInputRequested, ToolCalled
from graphrun.runtime.errors import WaitingForHuman


class WaitingInToolLoop(WaitingForHuman):
    """A built-in asked a person and none can answer here: the run waits."""

    #: Not a tool failure: the llm visit stops here and is resumed with the answer.
    suspends_tool_loop = True

    def __init__(self, message: str, request: HumanInputRequested) -> None:
        super().__init__(message)
        self.request = request


def _options(args: dict[str, Any]) -> list[str] | str:
    raw = args.get("options")
    if isinstance(raw, str):
        import json

        try:
            raw = json.loads(raw)
        except ValueError:
            return "'options' must be an array of strings"
    if not isinstance(raw, list) or not raw:
        return "'options' is required and must be an array of strings"
    return [str(v) for v in raw if isinstance(v, str | int | float)]


def _checkbox(answer: str, options: list[str]) -> list[str]:
    chosen: list[str] = []
    for part in (p.strip() for p in answer.split(",")):
        if part.isdigit() and 1 <= int(part) <= len(options):
            part = options[int(part) - 1]
        if part and part not in chosen:
            chosen.append(part)
    return chosen


class UserQuestions:
    """The user functions of one visit."""

    def __init__(self, ports: Any, ctx: Any, node_id: str, prior: tuple[Any, ...]) -> None:
        self.ports = ports
        self.ctx = ctx
        self.node_id = node_id
        mine = [e for e in prior if getattr(e, "node_id", None) == node_id]
        # Questions whose calls were recorded before: the next call asks the next one.
        self.asked = sum(
            1 for e in mine if isinstance(e, ToolCalled) and e.name.startswith("user__")
        )
        self._asked_before: tuple[list[Any], list[Any]] | None = None

    def _recorded(self) -> tuple[list[Any], list[Any]]:
        """The questions this visit asked before (and their answers), from the log: a
        question is not part of the visit's effects, so it is read back."""
        if self._asked_before is None:
            visit = self.ctx.visit
            events = [
                e
                for e in self.ports.store.read(self.ports.run_id)
                if getattr(e, "node_id", None) == self.node_id and getattr(e, "visit", 0) == visit
            ]
            self._asked_before = (
                [e for e in events if isinstance(e, HumanInputRequested)],
                [e for e in events if isinstance(e, HumanInputReceived)],
            )
        return self._asked_before

    def _escalates(self) -> bool:
        """Whether this run is an agent another model spawned (``agent__spawn``): its
        questions go to that model (an escalation), never to a terminal."""
        from graphrun.eventstore.events import RunStarted
        from graphrun.eventstore.fold import fold
        from graphrun.runtime.graph.loader import graph_of

        store = self.ports.store
        first = store.read(self.ports.run_id, upto=1)
        started = first[0] if first and isinstance(first[0], RunStarted) else None
        if started is None or not started.parent_run_id or not started.parent_node_id:
            return False
        parent = graph_of(fold(store.read(started.parent_run_id, upto=1))).graph
        node = parent.nodes.get(started.parent_node_id)
        return getattr(node, "type", None) == "llm"

    def call(self, action: str, args: dict[str, Any], cancel: Any) -> dict[str, Any]:
        question = str(args.get("question") or "").strip()
        if not question:
            return {"error": "'question' is required"}
        options: list[str] = []
        if action in ("select", "ask", "checkbox"):
            got = _options(args)
            if isinstance(got, str):
                return {"error": got}
            options = got
        elif action == "confirm":
            options = ["yes", "no"]
        elif action != "input":
            return {"error": f"unknown user function 'user__{action}'"}
        kind = "approval" if action in ("select", "confirm") else "input"
        index = self.asked
        self.asked += 1
        answer = self._answer(index, kind, question, options, action)
        if action == "checkbox":
            return {"answers": _checkbox(answer, options)}
        if action == "ask" and answer.strip().isdigit() and 1 <= int(answer) <= len(options):
            answer = options[int(answer) - 1]  # the option's number, as the menu shows them
        return {"answer": answer}

    def _answer(self, index: int, kind: str, question: str, options: list[str], action: str) -> str:
        requests, answers = self._recorded()
        if index < len(requests):
            request = requests[index]
            received = [a for a in answers if a.seq > request.seq]
            if received:
                return received[0].answer
            raise WaitingInToolLoop(
                f"run waits for an answer at node '{self.node_id}' ({action})", request
            )
        shown = question
        if action == "checkbox":
            numbered = ", ".join(f"{i}. {o}" for i, o in enumerate(options, 1))
            shown = f"{question}\n(choose any of: {numbered}; separate them with commas)"
        request = HumanInputRequested(
            node_id=self.node_id,
            visit=self.ctx.visit,
            kind=kind,
            question=shown,
            options=options,
        )
        self.ctx.record(request)
        checkpoint = getattr(self.ctx, "checkpoint", None)
        if checkpoint is not None:
            checkpoint()
        options_ = self.ports.options
        if not options_.interactive or self._escalates():
            raise WaitingInToolLoop(
                f"run waits for an answer at node '{self.node_id}' ({action})", request
            )
        from graphrun.actors.human.prompt import ask_choice, ask_text, identity

        # The question closes if the run ends while it is asked (its token).
        cancel = getattr(self.ctx, "cancel", None)
        if kind == "approval":
            text = ask_choice(shown, options, cancel=cancel).text
        else:
            text = ask_text(shown, default=None, cancel=cancel).text
        self.ctx.record(identity(options_.as_user).answered(request, text, "tty"))
        return text
