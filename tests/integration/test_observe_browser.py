"""Reports and graph pictures in a real browser (Debian's chromium, driven by Playwright).

Every example run (imported from replays/) is reported and opened: no console
error, every node of the run and of its child runs shown, one lane per run.
Graph pictures: the Mermaid text of every example, and of a graph with every node
type, is parsed by Mermaid's own parser (mermaid.min.js from npm, in the page);
DOT is parsed by pydot and laid out by Graphviz.

Set ``GRAPHRUN_UPDATE_SCREENSHOTS=1`` to rewrite the screenshots in docs/images.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, GraphrunCli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
MERMAID_JS = ROOT / ".venv" / "node" / "mermaid" / "node_modules" / "mermaid" / "dist"
MERMAID_JS = MERMAID_JS / "mermaid.min.js"
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "graph.yaml").is_file())
REPLAYS = sorted((ROOT / "replays").glob("*.run.jsonl"))
SCREENSHOTS = ROOT / "docs" / "images"

EVERY_TYPE = """
name: every-type
version: "1.0"
model: openai:gpt-4o-mini
start: fetch
nodes:
  fetch:
    type: script
    script: scripts/fetch.py
    fallback: broken
    next: lookup
  lookup:
    type: rag
    documents: ["docs/"]
    next: draft
  draft:
    type: llm
    prompt: "Draft from {{output}}"
    fallback: broken
    next: check
  check:
    type: agent
    agent: checker
    prompt: "{{output}}"
    next: review
  review:
    type: approval
    question: "Publish?"
    options: [approve, "say \\"no\\" | later"]
    routes: {approve: published, "say \\"no\\" | later": reason}
    on_other: reason
  reason:
    type: input
    question: "Why?"
    next: fetch
  published: {type: end, output: "done"}
  broken: {type: end, status: failed, output: "broken"}
"""
FETCH_PY = """
    import json
    print(json.dumps({"_next": "published"}))
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (tests/support/setup-browser.sh installs it)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page that records every console message and uncaught error."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.problems: list[str] = []
        self.page.on(
            "console",
            lambda m: (
                self.problems.append(f"{m.type}: {m.text}")
                if m.type in ("error", "warning")
                else None
            ),
        )
        self.page.on("pageerror", lambda e: self.problems.append(f"pageerror: {e}"))
        # No network at view time: any request other than the file itself is a failure.
        self.page.route(
            "**/*",
            lambda route: (
                route.continue_()
                if route.request.url.startswith("file://")
                else (self.problems.append(f"network: {route.request.url}"), route.abort())[-1]
            ),
        )

    def close(self) -> None:
        self.page.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    p = Page(browser)
    yield p
    p.close()


def _screenshot(page: Page, name: str, tmp_path: Path) -> Path:
    target = SCREENSHOTS if os.environ.get("GRAPHRUN_UPDATE_SCREENSHOTS") else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    path = target / name
    page.page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000
    return path


def _import_all(graphrun: GraphrunCli) -> list[dict[str, Any]]:
    for replay in REPLAYS:
        res = graphrun("import", str(replay))
        assert res.code == 0, res.stderr
    return graphrun("runs", "--json").json_lines()  # type: ignore[return-value]


def _nodes_of_tree(graphrun: GraphrunCli, run_id: str) -> tuple[set[str], int]:
    """Every node id entered in the run and its child runs; the number of runs."""
    nodes: set[str] = set()
    runs = 0
    todo = [run_id]
    while todo:
        rid = todo.pop()
        runs += 1
        for e in graphrun("events", rid, "--json").json_lines():
            assert isinstance(e, dict)
            if e["type"] == "NodeEntered":
                nodes.add(e["node_id"])
            elif e["type"] == "ChildRunStarted":
                todo.append(e["child_run_id"])
    return nodes, runs


def test_report_of_every_example_run_opens_cleanly(graphrun, page, tmp_path):
    rows = _import_all(graphrun)
    roots = [r for r in rows if not r["parent_run_id"]]
    assert len(roots) == len(REPLAYS)
    for row in roots:
        run_id = row["run_id"]
        out = tmp_path / f"{run_id}.html"
        res = graphrun("report", run_id, "-o", str(out))
        assert res.code == 0, res.stderr
        page.page.goto(out.as_uri())
        assert page.problems == [], (row["graph_name"], page.problems)
        nodes, runs = _nodes_of_tree(graphrun, run_id)
        shown = set(
            page.page.eval_on_selector_all(".bar[data-node]", "bs => bs.map(b => b.dataset.node)")
        )
        assert nodes <= shown, (row["graph_name"], nodes - shown)
        lanes = page.page.eval_on_selector_all(".lane", "ls => ls.map(l => l.dataset.run)")
        assert len(set(lanes)) == runs
        details = page.page.locator("details.visit").count()
        assert details == page.page.locator("#visits tr").count() - 2  # header and total
        if row["graph_name"] == "research-desk":
            assert len(lanes) == 2  # the run and its child run
            _screenshot(page, "report-research-desk.png", tmp_path)
        # Expanding every visit works (the one script on the page).
        page.page.click("#expand-all")
        assert page.page.locator("details.visit[open]").count() == details
        assert page.problems == []


def test_report_escapes_what_a_model_wrote(graphrun, agent, fake_llm, page, tmp_path):
    from tests.support.fake_llm import text

    fake_llm.script(text('**bold** <img src=x onerror="alert(1)"> [x](javascript:alert(2))'))
    root = agent(
        """
        name: echo
        version: "1.0"
        model: openai:gpt-4o-mini
        start: ask
        nodes:
          ask:
            type: llm
            prompt: "{{initial_prompt}}"
            state_updates: {said: "{{output}}"}
            next: done
          done: {type: end, output: "{{said}}"}
        """
    )
    res = graphrun(
        "run", str(root), "<script>alert(3)</script>",
        OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-t",
    )  # fmt: skip
    assert res.code == 0, res.stderr
    out = tmp_path / "r.html"
    assert graphrun("report", graphrun.last_run(), "-o", str(out)).code == 0
    html = out.read_text()
    assert "<img" not in html and "<script>alert" not in html
    assert 'href="javascript:' not in html and "&lt;img src=x" in html
    page.page.on("dialog", lambda d: page.problems.append(f"dialog: {d.message}"))
    page.page.goto(out.as_uri())
    page.page.click("#expand-all")
    assert page.page.locator("strong", has_text="bold").count() >= 1  # Markdown rendered
    assert page.problems == []


def test_report_of_a_run_waiting_for_a_person(graphrun, agent, page, tmp_path):
    root = agent(
        """
        name: gate
        version: "1.0"
        start: review
        nodes:
          review:
            type: approval
            question: "Ship it?"
            options: [approve, reject]
            routes: {approve: done, reject: done}
            on_other: done
          done: {type: end, output: "ok"}
        """
    )
    assert graphrun("run", str(root), "go").code == 3
    out = tmp_path / "w.html"
    assert graphrun("report", graphrun.last_run(), "-o", str(out)).code == 0
    page.page.goto(out.as_uri())
    assert page.problems == []
    assert page.page.locator(".bar.wait").count() == 1
    assert "in progress" in page.page.inner_text("header")
    assert "(waiting)" in page.page.inner_text("#decisions")


def _graph_targets(agent: Any) -> list[Path]:
    every = agent(EVERY_TYPE, {"scripts/fetch.py": FETCH_PY}, name="every-type")
    parallel = agent(PARALLEL, PARALLEL_SCRIPTS, name="parallel")
    return [*EXAMPLES, every, parallel]


def test_mermaid_of_every_graph_parses(graphrun, agent, page):
    if not MERMAID_JS.is_file():
        pytest.skip("mermaid is not installed (tests/support/setup-browser.sh installs it)")
    page.page.set_content("<!DOCTYPE html><html><body></body></html>")
    page.page.add_script_tag(path=str(MERMAID_JS))
    parse = (
        "async (t) => { try { await mermaid.parse(t); return 'ok'; }"
        " catch (e) { return String(e); } }"
    )
    # The parser really rejects broken text.
    assert page.page.evaluate(parse, "flowchart TD\n  a --> end\n") != "ok"
    texts = []
    for target in _graph_targets(agent):
        res = graphrun("graph", str(target))
        assert res.code == 0, res.stderr
        texts.append((target.name, res.stdout))
    graphrun("import", str(ROOT / "replays" / "release-checklist.run.jsonl"))
    run_id = graphrun.last_run()
    highlighted = graphrun("graph", str(ROOT / "examples" / "release-checklist"), "--run", run_id)
    assert "linkStyle" in highlighted.stdout and "×" in highlighted.stdout
    texts.append(("release-checklist --run", highlighted.stdout))
    from graphrun.runtime.observe.graphpic import build_picture, to_mermaid

    texts.append(("parallel and map", to_mermaid(build_picture(_parallel_graph()))))
    for name, text in texts:
        assert page.page.evaluate(parse, text) == "ok", (name, text)
    assert page.problems == []


def test_dot_of_every_graph_parses_and_lays_out(graphrun, agent, page, tmp_path):
    pydot = pytest.importorskip("pydot")
    for target in _graph_targets(agent):
        res = graphrun("graph", str(target), "--format", "dot")
        assert res.code == 0, res.stderr
        with warnings.catch_warnings():
            # pydot's parser calls pyparsing's old (deprecated) method names.
            warnings.simplefilter("ignore", DeprecationWarning)
            (parsed,) = pydot.graph_from_dot_data(res.stdout)
        names = {n.get_name().strip('"') for n in parsed.get_nodes()}
        assert "__start__" in names
    if shutil.which("dot") is None:
        pytest.skip("graphviz is not installed (tests/support/setup-browser.sh installs it)")
    graphrun("import", str(ROOT / "replays" / "release-checklist.run.jsonl"))
    out = tmp_path / "graph.html"
    res = graphrun(
        "graph", str(ROOT / "examples" / "release-checklist"), "--format", "html",
        "--run", graphrun.last_run(), "-o", str(out),
    )  # fmt: skip
    assert res.code == 0, res.stderr
    page.page.goto(out.as_uri())
    assert page.problems == []
    svg_text = page.page.text_content("#graph svg") or ""
    for node in ("gather", "review", "clarify", "revise", "approved"):
        assert node in svg_text
    _screenshot(page, "graph-release-checklist.png", tmp_path)


def test_svg_without_graphviz_is_a_clear_error(graphrun, tmp_path):
    res = graphrun(
        "graph", str(EXAMPLES[0]), "--format", "svg", PATH=str(tmp_path)
    )  # no `dot` on this PATH
    assert res.code == 2
    assert res.stderr.startswith("error: SVG needs Graphviz's `dot` program")
    assert "Traceback" not in res.stderr


def _parallel_graph() -> Any:
    """A graph object as the parallel model will have it (next lists, a map node)."""
    from types import SimpleNamespace as NS

    nodes = {
        "plan": NS(type="llm", next=["left", "right"], fallback=None),
        "left": NS(type="script", next="join", script="x.py"),
        "right": NS(type="rag", next="join"),
        "join": NS(type="map", next="done", branch="one"),
        "one": NS(type="llm", next=None),
        "again": NS(type="map", next="done", branch=NS(type="llm", next=None)),
        "done": NS(type="end", next=None),
    }
    return NS(name="parallel", start="plan", nodes=nodes)


def test_parallel_lists_and_map_branches_are_drawn():
    from graphrun.runtime.observe.graphpic import build_picture, to_dot

    pic = build_picture(_parallel_graph())
    edges = {(e.src, e.dst, e.label, e.style) for e in pic.edges}
    assert ("plan", "left", "fan-out", "solid") in edges
    assert ("plan", "right", "fan-out", "solid") in edges
    assert ("join", "one", "each item", "dotted") in edges
    assert ("again", "again.branch", "each item", "dotted") in edges
    assert "again.branch" in json.dumps([n.id for n in pic.nodes])
    assert "style=dotted" in to_dot(pic)


PARALLEL = """
name: desk-parallel
version: "1.0"
start: plan
nodes:
  plan:
    type: script
    script: scripts/plan.py
    next: [prices, reviews]
  prices:
    type: script
    script: scripts/slow.py
    state_updates: {}
    next: summarize
  reviews:
    type: script
    script: scripts/slow.py
    state_updates: {}
    next: summarize
  summarize:
    type: map
    over: "{{items}}"
    as: item
    branch: one
    collect_into: notes
    next: done
  one:
    type: script
    script: scripts/one.py
  done: {type: end, output: "{{notes}}"}
"""
PARALLEL_SCRIPTS = {
    "scripts/plan.py": """
        import json
        print(json.dumps({"items": ["a", "b", "c"]}))
    """,
    "scripts/slow.py": """
        import json, time
        time.sleep(0.3)
        print(json.dumps({}))
    """,
    "scripts/one.py": """
        import json, os, time
        state = json.loads(os.environ["GRAPH_STATE"])
        time.sleep(0.2)
        print(json.dumps({"output": "note " + state["item"]}))
    """,
}


def test_report_of_a_parallel_run_has_one_lane_per_branch(graphrun, agent, page, tmp_path):
    root = agent(PARALLEL, PARALLEL_SCRIPTS, name="desk-parallel")
    res = graphrun("run", str(root), "go")
    assert res.code == 0, res.stderr
    run_id = graphrun.last_run()
    out = tmp_path / "parallel.html"
    assert graphrun("report", run_id, "-o", str(out)).code == 0
    page.page.goto(out.as_uri())
    assert page.problems == []
    lanes = page.page.eval_on_selector_all(".lane-name", "ls => ls.map(l => l.textContent)")
    assert lanes == [
        "run",
        "run · branch prices",
        "run · branch reviews",
        "run · branch summarize[0]",
        "run · branch summarize[1]",
        "run · branch summarize[2]",
    ]
    bars = page.page.eval_on_selector_all(
        ".lane", "ls => ls.map(l => [...l.querySelectorAll('.bar')].map(b => b.dataset.node))"
    )
    assert bars == [
        ["plan", "summarize", "done"],
        ["prices"],
        ["reviews"],
        ["one"],
        ["one"],
        ["one"],
    ]
    _screenshot(page, "report-parallel-run.png", tmp_path)
    plan_row = page.page.inner_text("#visits tr:nth-child(2)")
    assert "prices, reviews" in plan_row
    mermaid = graphrun("graph", str(root), "--run", run_id).stdout
    assert '-->|"fan-out"|' in mermaid and '-.->|"each item"|' in mermaid
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.graph.loader import load_graph
    from graphrun.runtime.observe.graphpic import build_picture, run_path

    store = SqliteStore(graphrun.db)
    pic = build_picture(load_graph(root).graph, root, run_path(store.read(run_id)))
    store.close()
    taken = {(e.src, e.dst) for e in pic.edges if e.taken}
    assert {("plan", "prices"), ("plan", "reviews"), ("prices", "summarize")} <= taken
