"""A run's report: one self-contained HTML file built from its event log.

Nothing is fetched when the page is viewed (inline CSS, a few lines of inline
JS, no fonts or scripts from elsewhere). Everything text that came from a run
(prompts, responses, state, answers) is escaped; Markdown is rendered by
markdown-it-py with raw HTML off, so a model's output can never inject markup.

The page has: a header (status, duration, usage), the timeline (one lane per
branch of each run and per child run; a bar per node visit and per human wait),
a table of node visits (latency, tokens, cost), each visit's details (state
before/after as a diff, LLM requests and responses, tool calls folded, script
output), human decisions, and a failed replay's divergences when given.
"""

from __future__ import annotations

import difflib
import html
import json
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgspec

from graphrun.actors.terminal import terminal_safe
from graphrun.eventstore import codec
from graphrun.eventstore.events import (
    BranchesJoined,
    CacheChecked,
    ChildRunFinished,
    ChildRunStarted,
    Event,
    HumanInputReceived,
    HumanInputRequested,
    LlmCalled,
    LlmContinued,
    LlmResult,
    NodeCompleted,
    NodeEntered,
    NodeFailed,
    NodeRetrying,
    RetrievalDone,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunStarted,
    ScriptFinished,
    ToolCalled,
    ToolFinished,
)
from graphrun.eventstore.fold import RunState, apply
from graphrun.eventstore.projections import graph_version
from graphrun.eventstore.store import read_in_pages
from graphrun.runtime.engine.usage import (
    BUILTIN_PRICES,
    Usage,
    call_usage,
    format_cost,
    format_usage,
)


class Visit(msgspec.Struct, kw_only=True, gc=False):
    """One node visit of one run.

    A map's items are thousands of visits. Each keeps strings and numbers (its
    effects' HTML, its state change rendered as it ended) and nothing that could
    lead back to it, so the cyclic collector need not walk it (``gc=False``): a big
    map's report is not slowed by collections that walk every visit again."""

    run_id: str
    node_id: str
    node_type: str
    visit: int
    branch: str
    start: float
    end: float | None = None
    status: str = "running"  # running, completed, failed, tolerated, skipped, cancelled, waiting
    routed_to: str | None = None
    error: str | None = None
    error_kind: str = ""
    # Why it was skipped (``if``/``unless``), cancelled or left out by a join.
    note: str = ""
    #: The state as the visit began, until it ends: then :attr:`state_html` shows
    #: what it changed. A map item has none (its result joins the state when the
    #: map's step ends).
    before: dict[str, Any] | None = None
    state_html: str = ""
    #: Each effect's event type and its details as HTML, in log order: rendered as it
    #: is read, so a long run's report keeps its page, not every decoded event.
    effects: tuple[tuple[str, str], ...] = ()
    #: Its LLM calls' usage (None: it made none).
    usage: Usage | None = None

    @property
    def key(self) -> str:
        return f"{self.run_id}-{self.node_id}-{self.visit}-{self.branch}"

    def ended(self, state: Mapping[str, Any]) -> None:
        """The visit's state change, rendered now that it is known."""
        if self.before is not None:
            self.state_html = _state_diff(self.before, dict(state))
            self.before = None


@dataclass
class Wait:
    """A person's turn: from the question to the answer (or still open)."""

    run_id: str
    node_id: str
    branch: str
    start: float
    end: float | None
    request: HumanInputRequested
    answer: HumanInputReceived | None = None


@dataclass
class RunView:
    run_id: str
    depth: int
    started: RunStarted | None
    status: str
    visits: list[Visit]
    waits: list[Wait]
    usage: Usage
    agent: str = ""
    parent_node: str | None = None
    #: The earliest and the latest time stamp in the log (0.0: none).
    first_ts: float = 0.0
    last_ts: float = 0.0
    #: How the run ended, when it has.
    end: RunCompleted | RunFailed | RunCancelled | None = None
    #: The child runs it started, in log order.
    children: list[ChildRunStarted] = field(default_factory=list)
    #: The failed branches an ``any``/``count`` join went on without.
    left_out: tuple[dict[str, Any], ...] = ()


def _branch(event: Event) -> str:
    return str(getattr(event, "branch", "") or "")


def view_run(
    events: Iterable[Event],
    prices: Mapping[str, tuple[float, float]],
    depth: int = 0,
    agent: str = "",
    md: Any = None,
) -> RunView:
    """The visits, waits and usage of one run's events, read once, in order (an
    iterator of pages keeps one page decoded at a time); ``md``: the Markdown
    renderer (one per report, not one per run of its tree)."""
    md = md if md is not None else _md()
    state = RunState()
    first: RunStarted | None = None
    run_id = ""
    first_ts = last_ts = 0.0
    end: RunCompleted | RunFailed | RunCancelled | None = None
    children: list[ChildRunStarted] = []
    visits: list[Visit] = []
    waits: list[Wait] = []
    open_visits: dict[tuple[str, int, str], Visit] = {}
    open_waits: dict[tuple[str, str], Wait] = {}
    items: dict[str, Visit] = {}
    usage = Usage()
    v: Visit | None
    w: Wait | None
    for event in events:
        before = state
        state = apply(state, event)
        branch = _branch(event)
        if not run_id:
            run_id = event.run_id
            first = event if isinstance(event, RunStarted) else None
        if event.ts:
            first_ts = min(first_ts, event.ts) if first_ts else event.ts
            last_ts = max(last_ts, event.ts)
        match event:
            case RunCompleted() | RunFailed() | RunCancelled():
                end = event
            case ChildRunStarted():
                children.append(event)
            case NodeEntered():
                v = Visit(
                    run_id=event.run_id,
                    node_id=event.node_id,
                    node_type=event.node_type,
                    visit=event.visit,
                    branch=branch,
                    start=event.ts,
                    before=dict(before.state),
                )
                visits.append(v)
                open_visits[(event.node_id, event.visit, branch)] = v
            case NodeCompleted() | NodeFailed():
                v = open_visits.pop((event.node_id, event.visit, branch), None)
                if v is not None:
                    v.end = event.ts
                    v.ended(state.state)
                    v.error_kind = event.error_kind
                    if isinstance(event, NodeFailed):
                        v.status, v.error = "failed", event.error
                    else:
                        fan_out = getattr(event, "fan_out", None) or []
                        v.routed_to = event.routed_to or ", ".join(fan_out) or None
                        v.status = "tolerated" if event.failed else "completed"
                        v.error = event.error
                        if event.skipped:
                            v.status, v.note = "skipped", f"skipped: {event.skipped}"
            case BranchesJoined():
                for b in event.cancelled:
                    v = next((o for k, o in open_visits.items() if k[2] == b), None)
                    if v is not None:
                        del open_visits[(v.node_id, v.visit, b)]
                        v.end = event.ts
                        v.ended(state.state)
                        v.status, v.note = "cancelled", f"cancelled by the join: {event.reason}"
                for b in event.failed:
                    v = next((o for o in reversed(visits) if o.branch == b), None)
                    if v is not None:
                        v.status = "failed"
                        v.note = f"failed before the join held: left out ({event.reason})"
                        v.error = v.error or event.errors.get(b) or None
            case HumanInputRequested():
                w = Wait(event.run_id, event.node_id, branch, event.ts, None, event)
                waits.append(w)
                open_waits[(event.node_id, branch)] = w
            case HumanInputReceived():
                w = open_waits.pop((event.node_id, branch), None)
                if w is not None:
                    w.end, w.answer = event.ts, event
            case _:
                pass
        node_id = getattr(event, "node_id", None)
        if node_id is not None and not isinstance(event, NodeEntered | NodeCompleted | NodeFailed):
            v = open_visits.get((node_id, getattr(event, "visit", 0), branch))
            if v is None:  # an effect recorded without the visit number: the open one
                v = next((o for k, o in open_visits.items() if k[0] == node_id), None)
            if v is None and branch:
                # A map item: its branch node runs without a visit of its own.
                v = items.get(branch)
                took = _effect_seconds(event)
                if v is None:
                    v = items[branch] = Visit(
                        run_id=event.run_id,
                        node_id=node_id,
                        node_type="map item",
                        visit=getattr(event, "visit", 1),
                        branch=branch,
                        start=event.ts - took,
                        state_html=_MAP_ITEM_STATE,
                    )
                    visits.append(v)
                v.start = min(v.start, event.ts - took)
                v.end = event.ts
                failed = getattr(event, "error", None) or getattr(event, "timed_out", False)
                v.status = "failed" if failed else "completed"
            if v is not None:
                v.effects = (*v.effects, (type(event).__name__, _effect(md, event, prices)))
                if isinstance(event, LlmCalled):
                    u = call_usage(event, prices)
                    if v.usage is None:
                        v.usage = Usage()
                    v.usage.add(u)
                    usage.add(u)
    for v in open_visits.values():
        if state.terminal:  # ended with the run (an end node, a cancellation, a timeout)
            v.end = last_ts
            v.ended(state.state)
            v.status = {
                "completed": "completed",
                "completed_with_errors": "completed",
                "cancelled": "cancelled",
            }.get(state.status, "failed")
        else:
            v.status = "waiting" if state.status == "waiting" else "running"
    return RunView(
        run_id=run_id,
        depth=depth,
        started=first,
        status=state.status,
        visits=visits,
        waits=waits,
        usage=usage,
        agent=agent,
        parent_node=first.parent_node_id if first else None,
        first_ts=first_ts,
        last_ts=last_ts,
        end=end,
        children=children,
        left_out=state.left_out,
    )


def _effect_seconds(event: Event) -> float:
    """How long an effect took, as it recorded it (0 when it does not say)."""
    ms = getattr(event, "duration_ms", None)
    if ms is None:
        ms = getattr(event, "latency_ms", 0.0)
    return float(ms or 0.0) / 1000


def collect_tree(
    store: Any, run_id: str, prices: Mapping[str, tuple[float, float]] | None = None
) -> list[RunView]:
    """The run and every child run it started, depth first, in start order."""
    table = BUILTIN_PRICES if prices is None else prices
    out: list[RunView] = []
    md = _md()

    def walk(rid: str, depth: int, agent: str) -> None:
        # Read light: an LLM call's wire bodies are decoded only while its part of
        # the page is rendered (a 10,000-item map's pages then leave no containers
        # behind for the cyclic collector to walk again and again).
        view = view_run(read_in_pages(store, rid, light=True), table, depth, agent, md)
        out.append(view)
        for e in view.children:
            if store.has_run(e.child_run_id):
                walk(e.child_run_id, depth + 1, e.agent)

    walk(run_id, 0, "")
    return out


# --- rendering ---------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0;color:#1d1d1f;
background:#fafafa}
header{background:#222;color:#eee;padding:14px 24px}
header h1{margin:0 0 4px 0;font-size:1.3em}
main{padding:12px 24px 40px}
h2{font-size:1.1em;margin-top:28px;border-bottom:1px solid #ddd;padding-bottom:4px}
.st-completed{color:#1b7a1b}.st-failed,.st-completed_with_errors{color:#b3261e}.st-running,.st-waiting{color:#b36b00}
.st-cancelled{color:#666}.st-tolerated{color:#b36b00}.st-skipped{color:#666}
table{border-collapse:collapse;font-size:0.9em;background:#fff}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f0f0f0}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.timeline{background:#fff;border:1px solid #ddd;padding:6px 8px;overflow-x:auto}
.lane{display:flex;align-items:center;height:30px;border-bottom:1px dashed #eee}
.lane-name{width:220px;flex:none;font-size:0.8em;color:#444;white-space:nowrap;overflow:hidden;
text-overflow:ellipsis}
.track{position:relative;flex:1;height:22px;min-width:600px}
.bar{position:absolute;top:2px;height:18px;border-radius:3px;font-size:11px;color:#fff;
white-space:nowrap;overflow:hidden;padding:0 3px;box-sizing:border-box;min-width:4px;
text-decoration:none;line-height:18px}
.bar.completed{background:#3f7fbf}.bar.failed{background:#b3261e}
.bar.tolerated{background:#c77700}.bar.cancelled{background:#777}.bar.skipped{background:#bbb}.bar.running{background:#888;
background-image:repeating-linear-gradient(45deg,#888 0 6px,#999 6px 12px)}
.bar.waiting,.bar.wait{background:#e9b949;color:#222}
.visit{background:#fff;border:1px solid #ddd;margin:10px 0;padding:4px 10px}
.visit>summary{cursor:pointer;font-weight:600}
pre{background:#f6f6f6;padding:6px;overflow-x:auto;white-space:pre-wrap;font-size:0.85em}
.diff .add{color:#1b7a1b}.diff .del{color:#b3261e}.diff .hunk{color:#777}
.msg{border-left:3px solid #ccc;margin:6px 0;padding:2px 10px;background:#fff}
.msg .role{font-size:0.75em;text-transform:uppercase;color:#777}
.msg.assistant{border-color:#3f7fbf}.msg.system{border-color:#999}.msg.user{border-color:#1b7a1b}
.muted{color:#777}
.md p{margin:4px 0}
"""

_JS = """
document.getElementById('expand-all').addEventListener('click', function () {
  var open = this.dataset.open !== '1';
  document.querySelectorAll('details.visit').forEach(function (d) { d.open = open; });
  this.dataset.open = open ? '1' : '0';
  this.textContent = open ? 'collapse all' : 'expand all';
});
"""


#: The report's one script (expand/collapse all): a page that embeds a report can
#: allow exactly this script by its hash.
SCRIPT = _JS


def _e(value: Any) -> str:
    """``value`` as HTML text: markup escaped, and its control and text-reordering
    characters written out (``\\u202e``, ``\\x1b``), since most of what a report
    shows came from a model, a tool, a script or a form: a right-to-left override
    in a model's reply must not reorder the question or the answer beside it."""
    text = terminal_safe("" if value is None else str(value))
    # (Most of a report's texts have no markup: one search instead of five replaces.)
    return html.escape(text) if _MARKUP.search(text) else text


_MARKUP = re.compile(r"[&<>\"']")


def _json(value: Any) -> str:
    """``value`` as indented JSON, keys sorted (as an llm call's body was sent)."""
    try:
        # msgspec's encoder and formatter: a report of a 10,000-item map shows 20,000
        # bodies, and the standard library indents in Python (~14x the time).
        encoded = msgspec.json.encode(value, order="sorted", enc_hook=str)
        return msgspec.json.format(encoded, indent=2).decode()
    except (TypeError, ValueError, OverflowError):  # keys not all strings, say
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)


def _md() -> Any:
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False, "linkify": False})


def _markdown(md: Any, text: str) -> str:
    """``text`` rendered as Markdown (no raw HTML), its control and text-reordering
    characters written out as :func:`_e` writes them."""
    text = terminal_safe(text)
    if _PLAIN.fullmatch(text):
        # One line of words and plain punctuation (a map item's prompt, a label) is a
        # paragraph of itself, as the parser would render it, without parsing it: a
        # report of a 10,000-item map has 20,000 such texts.
        quoted = text.replace('"', "&quot;")
        return f'<div class="md"><p>{quoted}</p>\n</div>'
    return f'<div class="md">{md.render(text)}</div>'


#: Texts Markdown renders as one plain paragraph: a letter first, no trailing space,
#: and no character that starts a block, an inline construct, an entity or an escape.
_PLAIN = re.compile(r"[A-Za-z](?:[A-Za-z0-9 ,.;:?!()%/=+'\"-]*[A-Za-z0-9,.;:?!()%/=+'\"-])?")


def _when(ts: float | None) -> str:
    if not ts:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}"


def _ms(start: float, end: float | None) -> str:
    if end is None:
        return "…"
    ms = (end - start) * 1000
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


_NO_USAGE = Usage()
_NOT_FINISHED = '<p class="muted">(the node has not finished)</p>'
_MAP_ITEM_STATE = (
    '<p class="muted">a map item: its result joins the state when the map\'s step ends</p>'
)


def _state_diff(before: dict[str, Any], after: dict[str, Any]) -> str:
    if before == after:
        return '<p class="muted">state unchanged</p>'
    lines = difflib.unified_diff(
        _json(before).splitlines(), _json(after).splitlines(), "before", "after", lineterm="", n=2
    )
    out = []
    for line in lines:
        cls = (
            "add"
            if line.startswith("+")
            else "del"
            if line.startswith("-")
            else "hunk"
            if line.startswith("@@")
            else ""
        )
        out.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    return '<pre class="diff">' + "\n".join(out) + "</pre>"


def _content_text(content: Any) -> str:
    """A message's content as text (strings, or lists of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                if "text" in part:
                    parts.append(str(part["text"]))
                elif part.get("type") == "tool_result":
                    parts.append(f"[tool result] {_content_text(part.get('content'))}")
                elif part.get("type") == "tool_use":
                    parts.append(f"[tool call] {part.get('name')}({_json(part.get('input'))})")
                else:
                    parts.append(_json(part))
            else:
                parts.append(str(part))
        return "\n\n".join(parts)
    return "" if content is None else _json(content)


def request_messages(request: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(role, text)`` of an OpenAI- or Anthropic-shaped request body."""
    out: list[tuple[str, str]] = []
    system = request.get("system")
    if system:
        out.append(("system", _content_text(system)))
    for m in request.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", "?"))
        text = _content_text(m.get("content"))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {}) if isinstance(call, dict) else {}
            text += f"\n\n[tool call] {fn.get('name')}({fn.get('arguments')})"
        out.append((role, text))
    return out


def _llm_call(md: Any, e: LlmCalled, prices: Mapping[str, tuple[float, float]]) -> str:
    u = call_usage(e, prices)
    raw_request = codec.wire_data(e.request)
    request = raw_request if isinstance(raw_request, dict) else {}
    head = (
        f"LLM call {e.purpose} · turn {e.iteration} · attempt {e.attempt} · {_e(e.model)} · "
        f"HTTP {_e(e.status)} · {e.latency_ms:.0f} ms · {_e(format_usage(u))}"
    )
    parts = [f'<details open class="call"><summary>{head}</summary>']
    messages = request_messages(request)
    # Earlier turns of a tool loop repeat the conversation: fold all but the newest.
    for i, (role, text) in enumerate(messages):
        newest = i >= len(messages) - 1 or e.iteration == 1
        body = _markdown(md, text)
        if newest:
            parts.append(
                f'<div class="msg {_e(role)}"><div class="role">{_e(role)}</div>{body}</div>'
            )
        else:
            parts.append(
                f'<details class="msg {_e(role)}"><summary class="role">{_e(role)}</summary>'
                f"{body}</details>"
            )
    tools = request.get("tools") or []
    if tools:
        names = [t.get("function", t).get("name", "?") for t in tools if isinstance(t, dict)]
        parts.append(f'<p class="muted">tools offered: {_e(", ".join(names))}</p>')
    if e.error:
        parts.append(f'<p class="st-failed">error: {_e(e.error)}</p>')
    if e.text:
        parts.append(
            '<div class="msg assistant"><div class="role">response</div>'
            f"{_markdown(md, e.text)}</div>"
        )
    for call in codec.wire_data(e.tool_calls) or ():
        if not isinstance(call, dict):
            continue
        parts.append(
            f"<details><summary>tool call: {_e(call.get('name'))}</summary>"
            f"<pre>{_e(call.get('arguments'))}</pre></details>"
        )
    parts.append(
        f"<details><summary>raw request</summary><pre>{_e(_json(raw_request))}</pre></details>"
    )
    response = codec.wire_data(e.response)
    if response is not None:
        parts.append(
            f"<details><summary>raw response</summary><pre>{_e(_json(response))}</pre></details>"
        )
    parts.append("</details>")
    return "".join(parts)


def _effect(md: Any, e: Event, prices: Mapping[str, tuple[float, float]]) -> str:
    match e:
        case LlmCalled():
            return _llm_call(md, e, prices)
        case ToolCalled():
            status = " (error)" if e.is_error else ""
            return (
                f"<details><summary>tool {_e(e.name)}{status} · {e.duration_ms:.0f} ms · "
                f"{_e(e.source)}</summary><pre>arguments: {_e(e.arguments)}\n\n"
                f"result: {_e(e.result)}</pre></details>"
            )
        case LlmResult():
            if e.error:
                return f'<p class="st-failed">LLM result: error: {_e(e.error)}</p>'
            return ""
        case LlmContinued():
            return (
                f"<details><summary>prompted again ({_e(e.reason)}, {e.count})</summary>"
                f"<pre>{_e(e.prompt)}</pre></details>"
            )
        case ScriptFinished():
            status = "timed out" if e.timed_out else f"exit {e.exit_code}"
            out = _json(e.output) if e.output is not None else e.stdout
            err = f"\n\nstderr:\n{e.stderr}" if e.stderr else ""
            error = f'<p class="st-failed">{_e(e.error)}</p>' if e.error else ""
            return (
                f"<p>script <code>{_e(e.script)}</code> · {status} · {e.duration_ms:.0f} ms</p>"
                f"{error}<pre>{_e(out)}{_e(err)}</pre>"
            )
        case RetrievalDone():
            hits = "".join(
                f"<li>{_e(h.get('source'))} (score {_e(h.get('score'))})</li>" for h in e.hits
            )
            return (
                f"<p>retrieval · query <q>{_e(e.query)}</q> · {e.duration_ms:.0f} ms</p>"
                f"<ul>{hits}</ul>" + (f'<p class="st-failed">{_e(e.error)}</p>' if e.error else "")
            )
        case ChildRunStarted():
            return (
                f'<p>child run <a href="#run-{_e(e.child_run_id)}">{_e(e.child_run_id)}</a> '
                f"of agent {_e(e.agent)}</p>"
            )
        case ChildRunFinished():
            return f"<p>child run {_e(e.child_run_id)} {_e(e.status)}</p>"
        case NodeRetrying():
            return (
                f'<p class="st-failed">attempt {e.attempt} failed: {_e(e.error)} · '
                f"tried again after {e.delay:g} s</p>"
            )
        case ToolFinished():
            result = _e(e.error) if e.error is not None else _e(_json(e.output))
            status = " (error)" if e.error is not None else ""
            return (
                f"<details><summary>tool {_e(e.tool)}{status} · {e.duration_ms:.0f} ms</summary>"
                f"<pre>params: {_e(e.arguments)}\n\nresult: {result}</pre></details>"
            )
        case CacheChecked():
            if e.from_run:
                return (
                    f'<p>cache hit: served from run <a href="#run-{_e(e.from_run)}">'
                    f"{_e(e.from_run)}</a> seq {e.from_seq}</p>"
                )
            return "<p>cache miss: performed and recorded here</p>"
        case HumanInputRequested():
            options = f" · options: {_e(', '.join(e.options))}" if e.options else ""
            return f"<p>asked ({_e(e.kind)}): <q>{_e(e.question)}</q>{options}</p>"
        case HumanInputReceived():
            return (
                f"<p>answered <b>{_e(e.answer)}</b> by {_e(e.by)} ({_e(identity_label(e))}) "
                f"via {_e(e.channel)} at {_when(e.ts)} UTC</p>"
            )
        case _:
            return ""


def identity_label(answer: HumanInputReceived | None) -> str:
    """How an answer's identity is known, at a glance: ``signed · SHA256:…`` (checked by
    ``graphrun audit --verify``, not by the report) or ``claimed``."""
    if answer is None:
        return ""
    if answer.signature:
        return f"signed · {answer.key}" if answer.key else "signed"
    return answer.identity if answer.identity in ("token", "proxy") else "claimed"


def _lanes(runs: list[RunView]) -> Iterator[tuple[str, str, str]]:
    """``(lane title, run id, bars html)`` per run and branch, from absolute times,
    a lane at a time (a map's 10,000 items are 10,000 lanes: each is made and
    written, never all of them held at once)."""
    firsts = [r.first_ts for r in runs if r.first_ts]
    t0 = min(firsts) if firsts else 0.0
    t1 = max((r.last_ts for r in runs if r.last_ts), default=1.0)
    now_open = any(v.end is None for r in runs for v in r.visits)
    if now_open:
        t1 = max(t1, time.time()) if runs and runs[0].status in ("running",) else t1
    span = max(t1 - t0, 1e-6)

    def pos(a: float, b: float | None) -> str:
        end = t1 if b is None else b
        left = (a - t0) / span * 100
        width = max((end - a) / span * 100, 0.4)
        return f"left:{left:.3f}%;width:{min(width, 100 - left):.3f}%"

    for r in runs:
        # Each branch's visits and waits in log order: sorted by branch once (the
        # sort keeps the log's order within a branch), then taken a branch at a time.
        visits = sorted(r.visits, key=_branch_key)
        waits = sorted(r.waits, key=_branch_key)
        branches = sorted({v.branch for v in visits} | {w.branch for w in waits}) or [""]
        i = j = 0
        for b in branches:
            title = ("  " * r.depth) + (f"child run {r.run_id} ({r.agent})" if r.depth else "run")
            if b:
                title += f" · branch {b}"
            bars = []
            while i < len(visits) and visits[i].branch == b:
                v = visits[i]
                i += 1
                tip = f"{v.node_id} #{v.visit} ({v.node_type}) {v.status} {_ms(v.start, v.end)}"
                if v.usage is not None:
                    tip += f" · {v.usage.total_tokens} tokens"
                bars.append(
                    f'<a class="bar {v.status}" style="{pos(v.start, v.end)}" '
                    f'href="#v-{_e(v.key)}" title="{_e(tip)}" data-node="{_e(v.node_id)}">'
                    f"{_e(v.node_id)}</a>"
                )
            while j < len(waits) and waits[j].branch == b:
                w = waits[j]
                j += 1
                who = f" answered by {w.answer.by}" if w.answer else " (waiting)"
                bars.append(
                    f'<span class="bar wait" style="{pos(w.start, w.end)}" '
                    f'title="{_e("waits for a person at " + w.node_id + who)}">'
                    f"⏳ {_e(w.node_id)}</span>"
                )
            yield title, r.run_id, "".join(bars)


def _branch_key(item: Visit | Wait) -> str:
    return item.branch


def build_report(
    store: Any,
    run_id: str,
    *,
    prices: Mapping[str, tuple[float, float]] | None = None,
    divergences: list[dict[str, Any]] | None = None,
    reload_every: float | None = None,
) -> str:
    """The HTML report of ``run_id`` and its child runs.

    ``reload_every``: while the run is in progress, the page reloads itself this
    often (``report --watch`` rewrites the file meanwhile).
    """
    table = BUILTIN_PRICES if prices is None else prices
    runs = collect_tree(store, run_id, table)
    return render_report(runs, table, divergences, reload_every)


def _write_in_chunks(f: TextIO, parts: Iterable[str], size: int = 1 << 16) -> None:
    """The parts written ~``size`` characters at a time (one write per small part
    costs more than the page)."""
    chunk: list[str] = []
    held = 0
    for part in parts:
        chunk.append(part)
        held += len(part)
        if held >= size:
            f.write("".join(chunk))
            chunk.clear()
            held = 0
    f.write("".join(chunk))


def write_report(
    store: Any,
    run_id: str,
    path: Path,
    *,
    prices: Mapping[str, tuple[float, float]] | None = None,
    divergences: list[dict[str, Any]] | None = None,
    reload_every: float | None = None,
) -> str:
    """Write the report of ``run_id`` to ``path`` a piece at a time (a 10,000-item
    map's page is never one string), then put it in place in one step: a browser
    reloading it (``report --watch``) never reads half a page.

    Returns the run's status as the page shows it: a watcher stops on the page it
    wrote, never on a later read (a run ending between the two would leave an
    "in progress" page behind for good)."""
    table = BUILTIN_PRICES if prices is None else prices
    runs = collect_tree(store, run_id, table)
    parts = report_parts(runs, table, divergences, reload_every)
    if path.exists() and not path.is_file():  # a device or a pipe: written as it is
        with path.open("w", encoding="utf-8") as f:
            _write_in_chunks(f, parts)
        return runs[0].status
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("w", encoding="utf-8") as f:
            _write_in_chunks(f, parts)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return runs[0].status


def report_parts(
    runs: list[RunView],
    prices: Mapping[str, tuple[float, float]],
    divergences: list[dict[str, Any]] | None = None,
    reload_every: float | None = None,
) -> Iterator[str]:
    md = _md()
    root = runs[0]
    started = root.started
    total = Usage()
    for r in runs:
        total.add(r.usage)
    last_ts = max((r.last_ts for r in runs), default=0.0)
    title = f"{started.graph_name if started else '?'} · run {root.run_id}"
    end_event = root.end
    yield from [
        "<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f'<meta http-equiv="refresh" content="{reload_every:g}">'
        if reload_every and not end_event
        else "",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{_e(title)}</h1>",
        f'<div>status <b class="st-{_e(root.status)}">{_e(root.status)}</b>',
    ]
    if started:
        yield (
            f" · started {_when(started.ts)} UTC by {_e(started.started_by)}"
            f" · {_ms(started.ts, last_ts)}"
        )
    if started and started.graph_hash:
        yield f" · graph version <code>{_e(graph_version(started.graph_hash))}</code>"
    yield f" · {_e(format_usage(total))}"
    if len(runs) > 1:
        yield f" (with {len(runs) - 1} child run{'s' if len(runs) > 2 else ''})"
    yield "</div>"
    if not end_event:
        yield (
            f'<div class="muted">in progress as of {_when(last_ts)} UTC — run '
            f"<code>graphrun report {_e(root.run_id)}</code> again to refresh</div>"
        )
    yield "</header><main>"
    if started and started.initial_prompt:
        yield f"<h2>Prompt</h2>{_markdown(md, started.initial_prompt)}"
    if isinstance(end_event, RunCompleted) and end_event.unhandled_failures:
        yield '<h2 class="st-failed">Unhandled failures</h2><ul>'
        for f in end_event.unhandled_failures:
            yield (
                f"<li>node <code>{_e(f.get('node'))}</code> (visit {_e(f.get('visit'))}): "
                f"{_e(f.get('error'))}</li>"
            )
        yield (
            "</ul><p>No <code>fallback</code> took these failures: they routed on to "
            "<code>next</code>, so the output below may hold a failure's text, "
            "not a result.</p>"
        )
    if root.left_out:
        yield '<h2 class="st-failed">Branches left out</h2><ul>'
        for f in root.left_out:
            error = f.get("error") or "(its error was not recorded)"
            yield (
                f"<li>super-step {_e(f.get('step'))}, branch <code>{_e(f.get('branch'))}</code> "
                f"(node <code>{_e(f.get('node'))}</code>): {_e(error)}</li>"
            )
        yield (
            "</ul><p>These branches failed; the fan-out's join went on without them, "
            "as its policy allows.</p>"
        )
    if isinstance(end_event, RunCompleted):
        yield f"<h2>Output</h2>{_markdown(md, end_event.output)}"
    elif isinstance(end_event, RunFailed):
        yield f'<h2>Error</h2><p class="st-failed">{_e(end_event.error)}</p>'
    elif isinstance(end_event, RunCancelled):
        yield f'<h2>Cancelled</h2><p class="st-cancelled">{_e(end_event.reason)}</p>'

    yield '<h2>Timeline</h2><div class="timeline" id="timeline">'
    for lane_title, rid, bars in _lanes(runs):
        yield (
            f'<div class="lane" data-run="{_e(rid)}"><div class="lane-name" '
            f'title="{_e(lane_title)}">{_e(lane_title)}</div>'
            f'<div class="track">{bars}</div></div>'
        )
    yield "</div>"

    yield (
        '<h2>Node visits</h2><table id="visits"><tr><th>run</th><th>node</th><th>visit</th>'
        "<th>type</th><th>branch</th><th>started (UTC)</th><th>latency</th><th>status</th>"
        "<th>routed to</th><th>LLM calls</th><th>tokens in</th><th>tokens out</th>"
        "<th>cost</th></tr>"
    )
    for r in runs:
        for v in r.visits:
            u = v.usage or _NO_USAGE
            cost = format_cost(u.cost) if u.calls and u.cost_known else ("?" if u.calls else "")
            yield (
                f'<tr><td>{_e(r.run_id)}</td><td><a href="#v-{_e(v.key)}">{_e(v.node_id)}</a></td>'
                f'<td class="num">{v.visit}</td><td>{_e(v.node_type)}</td><td>{_e(v.branch)}</td>'
                f'<td>{_when(v.start)}</td><td class="num">{_ms(v.start, v.end)}</td>'
                f'<td class="st-{v.status}">{v.status}</td><td>{_e(v.routed_to)}</td>'
                f'<td class="num">{u.calls or ""}</td>'
                f'<td class="num">{u.input_tokens if u.calls else ""}</td>'
                f'<td class="num">{u.output_tokens if u.calls else ""}</td>'
                f'<td class="num">{cost}</td></tr>'
            )
    total_cost = format_cost(total.cost) if total.cost_known else "?"
    yield (
        f'<tr><th colspan=9>total</th><td class="num">{total.calls}</td>'
        f'<td class="num">{total.input_tokens}</td><td class="num">{total.output_tokens}</td>'
        f'<td class="num">{total_cost}</td></tr></table>'
    )

    decisions = [w for r in runs for w in r.waits]
    if decisions:
        yield (
            '<h2>Human decisions</h2><table id="decisions"><tr><th>asked (UTC)</th>'
            "<th>run</th><th>node</th><th>shown</th><th>answer</th><th>by</th><th>identity</th>"
            "<th>via</th><th>answered (UTC)</th></tr>"
        )
        for w in decisions:
            a = w.answer
            shown = w.request.question + (
                f"\noptions: {', '.join(w.request.options)}" if w.request.options else ""
            )
            who = ""
            if a is not None:
                who = a.by + (f" ({a.os_user}@{a.host})" if a.os_user and a.os_user != a.by else "")
            yield (
                f"<tr><td>{_when(w.start)}</td><td>{_e(w.run_id)}</td><td>{_e(w.node_id)}</td>"
                f"<td><pre>{_e(shown)}</pre></td>"
                f"<td>{_e(a.answer if a else '(waiting)')}</td><td>{_e(who)}</td>"
                f"<td>{_e(identity_label(a))}</td>"
                f"<td>{_e(a.channel if a else '')}</td>"
                f"<td>{_when(a.ts if a else None)}</td></tr>"
            )
        yield "</table>"

    if divergences is not None:
        yield '<h2>Replay divergences</h2><div id="divergences">'
        if not divergences:
            yield "<p>the replay decided the same at every step</p>"
        for d in divergences:
            where = f"seq {d.get('seq')} · node {d.get('node_id')} · {d.get('kind')}"
            yield (
                f'<div class="visit"><p class="st-failed">{_e(where)}: {_e(d.get("message"))}</p>'
                f"<pre>{_e(d.get('diff') or '')}</pre></div>"
            )
        yield "</div>"

    yield (
        '<h2>Details <button id="expand-all" type="button">expand all</button></h2>'
        '<div id="details">'
    )
    for r in runs:
        if r.depth:
            yield (
                f'<h2 id="run-{_e(r.run_id)}">child run {_e(r.run_id)} · agent {_e(r.agent)} · '
                f'<span class="st-{_e(r.status)}">{_e(r.status)}</span> · '
                f"{_e(format_usage(r.usage))}</h2>"
            )
        for v in r.visits:
            head = (
                f"{_e(v.node_id)} #{v.visit} · {_e(v.node_type)}"
                + (f" · branch {_e(v.branch)}" if v.branch else "")
                + f' · <span class="st-{v.status}">{v.status}</span> · {_ms(v.start, v.end)}'
                + (f" → {_e(v.routed_to)}" if v.routed_to else "")
                + (f" · {_e(format_usage(v.usage))}" if v.usage is not None else "")
            )
            yield (
                f'<details class="visit" id="v-{_e(v.key)}" data-node="{_e(v.node_id)}">'
                f"<summary>{head}</summary>"
            )
            if v.note:
                yield f'<p class="st-{v.status}">{_e(v.note)}</p>'
            if v.error:
                kind = f" ({_e(v.error_kind)})" if v.error_kind else ""
                yield f'<p class="st-failed">error{kind}: {_e(v.error)}</p>'
            yield from (shown for _, shown in v.effects)
            yield "<h4>State</h4>" + (v.state_html or _NOT_FINISHED)
            yield "</details>"
    yield "</div></main>"
    yield f"<script>{_JS}</script></body></html>\n"


def render_report(
    runs: list[RunView],
    prices: Mapping[str, tuple[float, float]],
    divergences: list[dict[str, Any]] | None = None,
    reload_every: float | None = None,
) -> str:
    """The report's page, whole (:func:`report_parts` a piece at a time)."""
    return "".join(report_parts(runs, prices, divergences, reload_every))


def replay_divergences(store: Any, run_id: str, graph_path: str) -> list[dict[str, Any]]:
    """The divergences of replaying ``run_id`` against the graph at ``graph_path``."""
    from graphrun.runtime.graph.loader import load_graph
    from graphrun.runtime.replay.divergence import replay_events

    result = replay_events(store.read(run_id), load_graph(graph_path))
    found = getattr(result, "divergences", None)
    if found is None:
        found = [result.divergence] if result.divergence is not None else []
    return [d.as_dict() for d in found]


__all__ = [
    "RunView",
    "Visit",
    "Wait",
    "build_report",
    "collect_tree",
    "render_report",
    "replay_divergences",
    "report_parts",
    "request_messages",
    "view_run",
    "write_report",
]
