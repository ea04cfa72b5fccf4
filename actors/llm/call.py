"""The effect of an ``llm`` node: call the model, run its tools, extract structure.

The runtime's decider renders the prompts (and appends the schema hint); this
module performs the calls and records each as it happens:

1. Each HTTP attempt is recorded as ``LlmCalled`` the moment it ends. Transient
   failures (the spec's list, plus HTTP 408/409/429/5xx/529 and Anthropic's
   ``overloaded_error``) are retried up to ``max_attempts`` per call, waiting as
   the server's ``retry-after`` asks (capped) or with a doubling backoff.
2. The bounded tool-call loop: while the model asks for tools, each is run
   through the toolbox and recorded as ``ToolCalled``, and its result sent back.
   More than ``max_iterations`` turns fails the node. A call identical (name and
   arguments) to one of the previous turn is not run again: the model gets an
   error result saying so, and the turn still counts towards ``max_iterations``.
   When the model ends its turn, a toolbox with a ``continuation`` (Loki's
   built-ins: open todos, spawned agents still running) may prompt it again; that
   is recorded as ``LlmContinued`` before the next turn, and a resumed visit
   takes it from the log. A toolbox with ``instructions`` adds to the system
   prompt of the turns that follow a call, and its ``specs`` may grow (Loki's
   loaded skills); what a call added is recorded with it (``ToolCalled``'s
   ``instructions`` and ``tools``).
3. With an ``output_schema``, a reply that is not valid JSON for the schema goes
   to the structured-output extractor (purpose ``"extract"``), with one repair
   retry (purpose ``"repair"``) if the extractor's answer is unusable too.
4. The outcome is recorded as ``LlmResult``. ``error`` says why the node failed
   (the runtime shows ``LLM node failed: <error>``); an extraction failure
   leaves ``error`` empty and sets ``extract_error`` (the runtime fails the node
   with it), so the model's text stays inspectable.

Cancellation (``ctx.cancel``) and the node's ``timeout`` abort the in-flight
request, stop retries and tools, and fail the node.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import msgspec

from graphrun.actors.base import CancelToken, EffectContext
from graphrun.actors.llm.client import ClientFactory
from graphrun.actors.llm.config import LlmConfigError, ResolvedModel
from graphrun.actors.llm.providers import get_provider
from graphrun.actors.llm.providers.base import (
    ChatRequest,
    ChatResponse,
    LlmCallError,
    Post,
    Provider,
    ToolCall,
    ToolResult,
    ToolSpec,
)
from graphrun.actors.llm.structured import extractor_system, parse_json_output
from graphrun.actors.loop import blocking
from graphrun.eventstore.events import LlmCalled, LlmContinued, LlmResult, ToolCalled

# The scope token's reason when the node's own timeout fired.
_NODE_TIMEOUT = "node timeout"


def _nothing() -> None:
    """A callback that does nothing."""


# A visit's recorded turns, tool results and continuations when it has none.
_NONE_PRIOR: Mapping[Any, Any] = MappingProxyType({})
# The calls of a previous turn that asked for none.
_NO_CALLS: AbstractSet[tuple[str, str]] = frozenset()


class LlmTask(msgspec.Struct, frozen=True, kw_only=True):
    """One visit of an llm node, with its templates already rendered.

    ``system`` already carries the schema hint when the node has an
    ``output_schema`` and ``instructions`` (else ``prompt`` carries it). A struct:
    a map makes one per item, and a frozen dataclass takes ~10 times as long to make.
    """

    node_id: str
    visit: int = 1
    model: str  # provider:model
    system: str | None = None
    prompt: str
    temperature: float | None = None
    top_p: float | None = None
    max_attempts: int = 1
    max_iterations: int = 10
    timeout: float | None = None  # node wall clock in seconds; None = none
    output_schema: dict[str, Any] | None = None
    tools: tuple[str, ...] = ()  # the node's whitelist, as written
    # Sent only to models that take it (the provider's model rule table decides).
    reasoning_effort: str | None = None


class ToolboxLike(Protocol):
    """The tools an llm node may call (exactly the ones its ``tools:`` lists)."""

    @property
    def specs(self) -> list[ToolSpec]:
        """The tools offered on the next turn."""
        ...

    def call(self, name: str, arguments: str, *, cancel: CancelToken) -> ToolResult:
        """Run tool ``name`` with JSON ``arguments``; failures come back as ``is_error``."""
        ...


def perform_llm(
    task: LlmTask,
    ctx: EffectContext,
    *,
    client_factory: ClientFactory,
    toolbox: ToolboxLike | None = None,
) -> LlmResult:
    """Run an llm node's calls, recording each, and record and return the ``LlmResult``
    (blocking: each request waits on the calling thread).

    Raises:
        LlmReplayMissError: when replaying and the recording has no answer for a
            request (a divergence; the caller reports it with the node id).
    """
    run = _LlmRun(task, ctx, client_factory, toolbox)
    try:
        result = run.blocking(run.execute())
    finally:
        run.close()
    ctx.record(result)
    return result


def perform_side_call(
    task: LlmTask,
    ctx: EffectContext,
    *,
    client_factory: ClientFactory,
    purpose: str,
    iteration: int = 1,
) -> tuple[str | None, str | None]:
    """One call for a built-in of an llm visit (a child's output summarised):
    ``task.prompt`` to ``task.model``, no tools, recorded as ``LlmCalled`` of the
    visit with ``purpose`` and ``iteration`` (the how-manieth such call), served
    from the log when a resumed visit recorded it. Returns the text, or why not."""
    run = _LlmRun(task, ctx, client_factory, None)

    def steps() -> Steps:
        try:
            resolved = client_factory.resolve(task.model)
        except LlmConfigError as err:
            return str(err)
        run.resolved = resolved
        run.provider = get_provider(resolved.provider)
        run.client = client_factory.client(resolved.base_url)
        messages = [{"role": "user", "content": task.prompt}]
        return (yield from run._call(purpose, iteration, task.system, messages, (), sampling=True))

    try:
        response = run.blocking(steps())
    finally:
        run.close()
    if isinstance(response, str):
        return None, response
    return response.text, None


def perform_llm_async(
    task: LlmTask,
    ctx: EffectContext,
    *,
    client_factory: ClientFactory,
    toolbox: ToolboxLike | None = None,
) -> Coroutine[Any, Any, LlmResult]:
    """:func:`perform_llm` as a task on ``client_factory``'s event loop
    (:meth:`ClientFactory.run_on_loop`): the same calls, records and result, with each
    request awaited instead of holding a thread. Tools and commits, which block, run
    on the loop's executor; a wait between attempts is an asyncio wait. The visit is
    armed when the coroutine starts (one that is never awaited arms no timer and
    hooks nothing); it is the visit's own, with no coroutine around it."""
    return _LlmRun(task, ctx, client_factory, toolbox).performed()


# What an llm node's steps yield to whoever drives them (blocking or on an event loop):
# a request to send, a commit of what was recorded so far, a tool to run, a wait.
@dataclass(frozen=True, slots=True)
class _Checkpoint:
    pass


@dataclass(frozen=True, slots=True)
class _RunTool:
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


_CHECKPOINT = _Checkpoint()


def _advance(steps: Steps, value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand ``steps`` the last operation's value (or error): ``(False, next op)``, or
    ``(True, what they returned)``."""
    try:
        return False, steps.throw(error) if error is not None else steps.send(value)
    except StopIteration as stop:
        return True, stop.value


class _Abort:
    """Cancels the visit's task while it awaits a request, when the scope token fires
    (any thread): the cancellation is delivered between the task's steps, and never
    while the task does anything else. One per visit, hooked to the token once."""

    __slots__ = ("aborted", "loop", "posting", "task")

    def __init__(self, loop: Any, task: Any) -> None:
        self.loop = loop
        self.task = task
        self.posting = False
        self.aborted = False

    def __call__(self) -> None:
        self.loop.call_soon_threadsafe(self._abort)

    def _abort(self) -> None:  # on the loop's thread
        if self.posting and not self.aborted and self.task is not None:
            self.aborted = True
            self.task.cancel()

    def posted(self, scope: CancelToken) -> None:
        """A request is about to be awaited (on the loop's thread): a token that has
        already fired cancels it, as one firing while it is awaited does."""
        self.posting = True
        if scope.cancelled:
            self()

    def done(self) -> None:
        """The request is over: a token firing now cancels nothing."""
        self.posting = False
        if self.aborted:
            self.aborted = False
            if self.task is not None:
                self.task.uncancel()  # the cancellation was the abort's, and it is handled


_Op = Post | _Checkpoint | _RunTool | _Sleep
Steps = Generator[_Op, Any, Any]


class _LlmRun:
    """The state of one :func:`perform_llm`: the scope token, deadline and call count."""

    __slots__ = (
        "_timer",
        "_unhook",
        "_unsaved",
        "calls",
        "client",
        "ctx",
        "deadline",
        "factory",
        "prior_calls",
        "prior_continued",
        "prior_tools",
        "provider",
        "resolved",
        "scope",
        "task",
        "toolbox",
    )

    def __init__(
        self,
        task: LlmTask,
        ctx: EffectContext,
        factory: ClientFactory,
        toolbox: ToolboxLike | None,
    ) -> None:
        self.task = task
        self.ctx = ctx
        self.factory = factory
        self.toolbox = toolbox
        self.calls = 0
        # ``resolved``, ``provider`` and ``client`` are set by execute() before any call.
        # One token for everything that stops this node: the run's cancel and the
        # timeout. Without a timeout, that is the run's own token.
        self.scope = ctx.cancel if task.timeout is None else CancelToken()
        self._unhook: Callable[[], None] = _nothing
        # What this visit already recorded before the process stopped (a resumed tool
        # loop): successful turns and tool results are served from it, never repeated.
        # Mostly there is none: the empty lookups are shared, not built per visit.
        prior = getattr(ctx, "prior", ()) or ()
        self.prior_calls: Mapping[tuple[str, int, int], LlmCalled] = _NONE_PRIOR
        self.prior_tools: Mapping[tuple[int, str, str], ToolCalled] = _NONE_PRIOR
        self.prior_continued: Mapping[int, LlmContinued] = _NONE_PRIOR
        if prior:
            self.prior_calls = {
                (e.purpose, e.iteration, e.attempt): e
                for e in prior
                if isinstance(e, LlmCalled) and e.error is None
            }
            self.prior_tools = {
                (e.iteration, e.call_id, e.name): e for e in prior if isinstance(e, ToolCalled)
            }
            self.prior_continued = {e.iteration: e for e in prior if isinstance(e, LlmContinued)}
        # Whether something was recorded since the last commit (``_checkpoint``).
        self._unsaved = False
        self.deadline: float | None = None
        # The node's timeout fires the scope token: a timer armed by whoever drives
        # the steps (a thread's timer, or the loop's own ``call_later``).
        self._timer: Any = None

    def _arm(self, loop: Any = None) -> None:
        """Start the node's timeout (on ``loop`` when the steps are awaited there):
        its scope token fires with the run's, and when the timeout passes. A visit
        that is never driven arms nothing."""
        timeout = self.task.timeout
        if timeout is None:
            return
        self.deadline = time.monotonic() + timeout
        self._unhook = self.ctx.cancel.on_cancel(self._cancelled)
        if loop is not None:
            self._timer = loop.call_later(timeout, self.scope.cancel, _NODE_TIMEOUT)
            return
        self._timer = threading.Timer(timeout, self.scope.cancel, args=(_NODE_TIMEOUT,))
        self._timer.daemon = True
        self._timer.start()

    def _cancelled(self) -> None:
        """The run's token fired: so does this node's."""
        self.scope.cancel(self.ctx.cancel.reason or "cancelled")

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        # Dropping the unhook breaks the cycle run -> unhook -> callback -> run, so
        # the run is freed when it returns, not by the cyclic collector.
        unhook, self._unhook = self._unhook, _nothing
        unhook()

    # --- driving the steps ---------------------------------------------------

    def blocking(self, steps: Steps) -> Any:
        """Drive ``steps`` on this thread; what they return."""
        self._arm()
        value: Any = None
        error: BaseException | None = None
        while True:
            done, op = _advance(steps, value, error)
            if done:
                return op
            value, error = None, None
            try:
                if isinstance(op, Post):
                    with self.factory.abort_on(self.scope):
                        value = self.client.post(
                            op.url, content=op.content, headers=op.headers, timeout=op.timeout
                        )
                elif isinstance(op, _Checkpoint):
                    self._commit()
                elif isinstance(op, _RunTool):
                    value = self._run_tool(op.name, op.arguments)
                else:
                    value = self.scope.wait(op.seconds)
            except Exception as exc:  # the step that asked decides what it means
                error = exc

    async def performed(self) -> LlmResult:
        """The visit as a task on the client's event loop: drives :meth:`execute`,
        then records its result and returns it.

        A request is awaited; the scope token firing cancels it (``httpx.ReadError``,
        as a blocking request gets). Commits and tools block, so they run on the
        loop's executor, never on the loop itself; a wait between attempts is an
        asyncio wait the token cuts short."""
        loop = asyncio.get_running_loop()
        self._arm(loop)
        steps = self.execute()
        value: Any = None
        error: BaseException | None = None
        # The token firing while a request is awaited cancels this task there
        # (``post_async`` raises ``httpx.ReadError``), and only there.
        abort = _Abort(loop, asyncio.current_task())
        unhook = self.scope.on_cancel(abort)
        try:
            while True:
                done, op = _advance(steps, value, error)
                if done:
                    break
                value, error = None, None
                try:
                    if isinstance(op, Post):
                        abort.posted(self.scope)
                        try:
                            value = await self.client.post_async(
                                op.url, content=op.content, headers=op.headers, timeout=op.timeout
                            )
                        finally:
                            abort.done()
                    elif isinstance(op, _Checkpoint):
                        await blocking(self.ctx, self._commit)
                    elif isinstance(op, _RunTool):
                        value = await self._run_tool_async(loop, op.name, op.arguments)
                    else:
                        value = await self._sleep(loop, op.seconds)
                except Exception as exc:  # the step that asked decides what it means
                    error = exc
        finally:
            unhook()
            self.close()
        self.ctx.record(op)
        return op

    async def _sleep(self, loop: Any, seconds: float) -> bool:
        """Wait ``seconds`` or until the scope token fires; whether it fired."""
        woken = loop.create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        unhook = self.scope.on_cancel(lambda: loop.call_soon_threadsafe(wake))
        try:
            await asyncio.wait([woken], timeout=seconds)
        finally:
            unhook()
        return self.scope.cancelled

    def _commit(self) -> None:
        """Make what this visit recorded durable (before it acts again)."""
        checkpoint = getattr(self.ctx, "checkpoint", None)
        if checkpoint is not None:
            checkpoint()

    # --- the node ------------------------------------------------------------

    def execute(self) -> Steps:
        """The node's steps; they return its :class:`LlmResult`."""
        try:
            resolved = self.factory.resolve(self.task.model)
        except LlmConfigError as err:
            return self._result(error=str(err))
        self.resolved: ResolvedModel = resolved
        self.provider: Provider = get_provider(resolved.provider)
        self.client = self.factory.client(resolved.base_url)

        outcome = yield from self._tool_loop()
        if isinstance(outcome, str):
            return self._result(error=outcome)
        text = outcome.text
        if self.task.output_schema is None:
            return self._result(text=text)
        _, fast_error = parse_json_output(text, self.task.output_schema)
        if fast_error is None:
            return self._result(text=text)
        extracted, extract_error = yield from self._extract(text, self.task.output_schema)
        return self._result(text=text, extracted=extracted, extract_error=extract_error)

    def _tool_loop(self) -> Steps:
        """The bounded tool-call loop; returns the last response, or why it failed."""
        task = self.task
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        # The previous turn's calls, and the texts of turns the model was prompted
        # again after (both mostly empty: shared empty ones until there are some).
        previous: AbstractSet[tuple[str, str]] = _NO_CALLS
        said: tuple[str, ...] = ()
        for iteration in range(1, task.max_iterations + 1):
            # A call may add tools for the turns that follow (Loki's skills).
            specs: Sequence[ToolSpec] = list(self.toolbox.specs) if self.toolbox is not None else ()
            response = yield from self._call(
                "main", iteration, self._system(), messages, specs, sampling=True
            )
            if isinstance(response, str):
                return response
            if not response.tool_calls:
                again = self._continuation(iteration, response.text)
                if again is None:
                    if said and task.output_schema is None:
                        # Every turn's text, as Loki accumulates an agent's output.
                        joined = "\n".join([*said, response.text] if response.text else said)
                        return msgspec.structs.replace(response, text=joined)
                    return response
                if response.text:
                    said = (*said, response.text)
                    messages.append({"role": "assistant", "content": response.text})
                messages.append({"role": "user", "content": again.prompt})
                previous = _NO_CALLS
                continue
            if iteration == task.max_iterations:
                break
            messages.append(
                {
                    "role": "assistant",
                    "content": response.text,
                    "tool_calls": [call.as_dict() for call in response.tool_calls],
                }
            )
            for call in response.tool_calls:
                if self.scope.cancelled:
                    return self._stop_message()
                done = self.prior_tools.get((iteration, call.id, call.name))
                if done is not None:
                    # Ran and was recorded before an interruption: its result stands.
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call.id,
                            "content": done.result,
                            "is_error": done.is_error,
                        }
                    )
                    continue
                if (call.name, call.arguments) in previous:
                    result = ToolResult(
                        output=(
                            f"Not run: this call to {call.name} is identical to one in the "
                            "previous turn, whose result you already have. Change the "
                            "arguments or answer without calling it again."
                        ),
                        is_error=True,
                        duration_ms=0.0,
                        source="",
                    )
                else:
                    # The turn and earlier results are durable before the tool runs.
                    if self._unsaved:
                        yield from self._checkpoint()
                    result = yield _RunTool(call.name, call.arguments)
                if self.scope.cancelled:
                    # Stopped mid-call: not a result; a resumed run calls it again.
                    return self._stop_message()
                self._unsaved = True
                self.ctx.record(
                    ToolCalled(
                        node_id=task.node_id,
                        visit=self.ctx.visit,
                        iteration=iteration,
                        call_id=call.id,
                        name=call.name,
                        arguments=call.arguments,
                        result=result.output,
                        is_error=result.is_error,
                        duration_ms=result.duration_ms,
                        source=result.source,
                        instructions=result.instructions,
                        tools=list(result.tools),
                    )
                )
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "content": result.output,
                        "is_error": result.is_error,
                    }
                )
            previous = {(call.name, call.arguments) for call in response.tool_calls}
        return f"tool-call loop hit max_iterations={task.max_iterations}"

    def _system(self) -> str | None:
        """The node's system prompt for the next turn: its own, then what the toolbox
        has put into it so far (Loki's loaded skills, each after a blank line)."""
        added = getattr(self.toolbox, "instructions", None)
        text = added() if added is not None else ""
        if not text:
            return self.task.system
        return f"{self.task.system}\n\n{text}" if self.task.system else text

    def _continuation(self, iteration: int, text: str) -> LlmContinued | None:
        """Whether the model, which ended its turn, is prompted again: as recorded
        (a resumed visit), else as the toolbox says (Loki's ``auto_continue`` and its
        guardrail for spawned agents still running). Never on the last turn."""
        recorded = self.prior_continued.get(iteration)
        if recorded is not None:
            return recorded
        ask = getattr(self.toolbox, "continuation", None)
        if ask is None or iteration >= self.task.max_iterations or self.scope.cancelled:
            return None
        decided = ask(text)
        if decided is None:
            return None
        reason, prompt, count = decided
        event = LlmContinued(
            node_id=self.task.node_id,
            visit=self.ctx.visit,
            iteration=iteration,
            reason=reason,
            prompt=prompt,
            count=count,
        )
        self.ctx.record(event)
        self._unsaved = True
        return event

    def _checkpoint(self) -> Steps:
        """Commit what this visit recorded since the last commit. Callers test
        ``_unsaved`` first, so that no generator is made when nothing is unsaved."""
        yield _CHECKPOINT
        self._unsaved = False

    async def _run_tool_async(self, loop: Any, name: str, arguments: str) -> ToolResult:
        """:meth:`_run_tool` on the run's loop: a toolbox that can await its tools'
        processes does (``call_async``); any other is called on the executor."""
        executor = getattr(self.ctx, "executor", None)
        call_async = getattr(self.toolbox, "call_async", None)
        if call_async is None:
            done: ToolResult = await loop.run_in_executor(executor, self._run_tool, name, arguments)
            return done
        start = time.perf_counter()
        try:
            result: ToolResult = await call_async(
                name, arguments, cancel=self.scope, executor=executor
            )
            return result
        except Exception as exc:  # as _run_tool: the model hears of it
            if getattr(exc, "suspends_tool_loop", False):
                raise
            return ToolResult(
                output=f"tool '{name}' failed: {exc}",
                is_error=True,
                duration_ms=(time.perf_counter() - start) * 1000.0,
                source="",
            )

    def _run_tool(self, name: str, arguments: str) -> ToolResult:
        if self.toolbox is None:
            return ToolResult(
                output=f"No tools are available to this node; '{name}' cannot be called.",
                is_error=True,
                duration_ms=0.0,
                source="",
            )
        start = time.perf_counter()
        try:
            return self.toolbox.call(name, arguments, cancel=self.scope)
        except Exception as exc:  # a broken tool is the model's problem to hear about
            if getattr(exc, "suspends_tool_loop", False):
                raise  # not a failure: the visit stops here (a question waits for a person)
            return ToolResult(
                output=f"tool '{name}' failed: {exc}",
                is_error=True,
                duration_ms=(time.perf_counter() - start) * 1000.0,
                source="",
            )

    def _extract(self, text: str, schema: dict[str, Any]) -> Steps:
        """Structured output from ``text``: ``(json text, None)`` or ``(None, why not)``."""
        system = extractor_system(schema)
        messages: list[dict[str, Any]] = [{"role": "user", "content": text}]
        response = yield from self._call("extract", 1, system, messages, (), sampling=False)
        problem: str | None
        if isinstance(response, str):
            problem = response
        else:
            value, problem = parse_json_output(response.text, schema)
            if problem is None:
                return json.dumps(value, ensure_ascii=False), None
            messages = [
                *messages,
                {"role": "assistant", "content": response.text},
                {
                    "role": "user",
                    "content": f"That reply cannot be used: {problem}. Reply again with "
                    "only the corrected JSON object.",
                },
            ]
        if self.scope.cancelled:
            return None, f"structured output extraction failed: {self._stop_message()}"
        repaired = yield from self._call("repair", 1, system, messages, (), sampling=False)
        if isinstance(repaired, str):
            return None, f"structured output extraction failed: {repaired}"
        value, problem = parse_json_output(repaired.text, schema)
        if problem is not None:
            return None, f"structured output extraction failed: {problem}"
        return json.dumps(value, ensure_ascii=False), None

    # --- one call, with retries ----------------------------------------------

    def _call(
        self,
        purpose: str,
        iteration: int,
        system: str | None,
        messages: list[dict[str, Any]],
        tools: Sequence[ToolSpec],
        *,
        sampling: bool,
    ) -> Steps:
        """Returns the response, or a description of why the call failed (every attempt
        recorded)."""
        task = self.task
        attempts = max(1, task.max_attempts)
        for attempt in range(1, attempts + 1):
            if self.scope.cancelled:
                return self._stop_message()
            recorded = self.prior_calls.get((purpose, iteration, attempt))
            if recorded is not None:  # answered before an interruption: served from the log
                self.calls += 1
                return ChatResponse(
                    text=recorded.text or "",
                    tool_calls=[ToolCall(**call) for call in recorded.tool_calls],
                    usage=dict(recorded.usage),
                    status=recorded.status or 200,
                    body=recorded.response or {},
                    request_body=recorded.request,
                    url=recorded.url,
                    latency_ms=recorded.latency_ms,
                )
            # What this node recorded so far is durable before the next call goes out
            # (a failed attempt before an interruption is simply made again).
            if self._unsaved:
                yield from self._checkpoint()
            request = ChatRequest(
                model=task.model,
                system=system,
                # Not a copy: the provider reads them as it builds the request's
                # body, before this turn's answer is appended to them.
                messages=messages,
                tools=tools,
                temperature=task.temperature if sampling else None,
                top_p=task.top_p if sampling else None,
                reasoning_effort=task.reasoning_effort,
                timeout=self._remaining(),
            )
            try:
                response = yield from self.provider.exchange(self.resolved, request)
            except LlmCallError as err:
                # The request's own timeout is the node's remaining time, so it can fire
                # just before the node's timer does: that is the node timeout too.
                if self.deadline is not None and time.monotonic() >= self.deadline:
                    self.scope.cancel(_NODE_TIMEOUT)
                stopped = self.scope.cancelled
                message = self._stop_message() if stopped else err.message
                self._record(
                    purpose,
                    iteration,
                    attempt,
                    url=err.url,
                    request=err.request_body,
                    status=err.status,
                    response=err.body,
                    latency_ms=err.latency_ms,
                    error=message,
                    transient=err.transient and not stopped,
                )
                if stopped or not err.transient:
                    return message
                if attempt == attempts:
                    return (
                        f"{message} (gave up after {attempts} attempts)"
                        if attempts > 1
                        else message
                    )
                if (yield _Sleep(self.factory.retry.delay(attempt, err.retry_after))):
                    return self._stop_message()
                continue
            self._record(
                purpose,
                iteration,
                attempt,
                url=response.url,
                request=response.request_body,
                status=response.status,
                response=response.body,
                text=response.text,
                tool_calls=[call.as_dict() for call in response.tool_calls],
                usage=response.usage,
                latency_ms=response.latency_ms,
            )
            return response
        raise AssertionError("unreachable: the loop returns on its last attempt")

    def _record(self, purpose: str, iteration: int, attempt: int, **fields: Any) -> None:
        self.calls += 1
        self._unsaved = True
        self.ctx.record(
            LlmCalled(
                node_id=self.task.node_id,
                visit=self.ctx.visit,
                purpose=purpose,
                iteration=iteration,
                attempt=attempt,
                model=self.resolved.model_id,
                **fields,
            )
        )

    def _remaining(self) -> float | None:
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.001)

    def _stop_message(self) -> str:
        if self.scope.reason == _NODE_TIMEOUT and self.task.timeout is not None:
            return f"timed out after {self.task.timeout:g}s (node timeout)"
        return f"cancelled ({self.scope.reason or 'cancelled'})"

    def _result(
        self,
        *,
        text: str | None = None,
        error: str | None = None,
        extracted: str | None = None,
        extract_error: str | None = None,
    ) -> LlmResult:
        return LlmResult(
            node_id=self.task.node_id,
            visit=self.ctx.visit,
            text=text,
            error=error,
            extracted=extracted,
            extract_error=extract_error,
            calls=self.calls,
        )


__all__ = ["LlmTask", "ToolboxLike", "extract_structured", "perform_llm", "perform_llm_async"]


def extract_structured(
    text: str,
    schema: dict[str, Any],
    *,
    node_id: str,
    visit: int,
    model: str,
    ctx: EffectContext,
    client_factory: ClientFactory,
) -> LlmResult:
    """Run only the structured-output extractor over ``text`` (agent nodes: no hint).

    Records the extractor's calls and an ``LlmResult`` whose ``text`` is ``text``.
    """
    task = LlmTask(node_id=node_id, visit=visit, model=model, prompt="", output_schema=schema)
    run = _LlmRun(task, ctx, client_factory, None)
    try:
        try:
            run.resolved = client_factory.resolve(model)
        except LlmConfigError as err:
            result = run._result(text=text, extract_error=str(err))
        else:
            run.provider = get_provider(run.resolved.provider)
            run.client = client_factory.client(run.resolved.base_url)
            extracted, extract_error = run.blocking(run._extract(text, schema))
            result = run._result(text=text, extracted=extracted, extract_error=extract_error)
    finally:
        run.close()
    ctx.record(result)
    return result
