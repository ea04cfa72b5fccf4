"""`graphrun report` and `graphrun graph` from the command line: divergences, bad input."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import ROOT, GraphrunCli


def test_report_shows_the_divergences_of_a_replay_against_another_graph(
    graphrun: GraphrunCli, tmp_path
):
    graphrun("import", str(ROOT / "replays" / "release-checklist.run.jsonl"))
    run_id = graphrun.last_run()
    changed = tmp_path / "changed"
    shutil.copytree(ROOT / "examples" / "release-checklist", changed)
    graph = changed / "graph.yaml"
    text = graph.read_text()
    assert "options: [approve, reject]" in text and "      reject: rejected" in text
    graph.write_text(
        text.replace("options: [approve, reject]", "options: [approve, deny]").replace(
            "      reject: rejected", "      deny: rejected"
        )
    )
    out = tmp_path / "r.html"
    res = graphrun("report", run_id, "--divergence", str(changed), "-o", str(out))
    assert res.code == 0, res.stderr
    html = out.read_text()
    section = html.split('id="divergences">', 1)[1].split("</div>", 1)[0]
    assert "node review" in section and "differs in options" in section
    same = graphrun(
        "report", run_id, "--divergence", str(ROOT / "examples" / "release-checklist"),
        "-o", str(out),
    )  # fmt: skip
    assert same.code == 0
    assert "the replay decided the same at every step" in out.read_text()


def test_bad_input_is_one_line_and_exit_2(graphrun: GraphrunCli, tmp_path):
    graphrun("import", str(ROOT / "replays" / "file-triage.run.jsonl"))
    run_id = graphrun.last_run()
    before = graphrun("events", run_id, "--json").stdout
    cases = [
        ("report", "nope"),
        ("logs", "nope"),
        ("tail", "nope"),
        ("otel", "nope", "--console"),
        ("report", run_id, "-o", str(tmp_path / "missing" / "r.html")),
        ("graph", str(tmp_path / "no-such-agent")),
        ("graph", str(ROOT / "examples" / "file-triage"), "--run", "nope"),
    ]
    for args in cases:
        res = graphrun(*args)
        assert res.code == 2, (args, res.stderr)
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, (args, res.stderr)
    missing = tmp_path / "missing"
    assert graphrun("report", run_id, "-o", str(missing / "r.html")).stderr == (
        f"error: -o {missing / 'r.html'}: folder {missing} does not exist\n"
    )
    assert graphrun("events", run_id, "--json").stdout == before


def test_graph_of_a_run_highlights_its_path(graphrun: GraphrunCli):
    graphrun("import", str(ROOT / "replays" / "file-triage.run.jsonl"))
    run_id = graphrun.last_run()
    res = graphrun("graph", str(ROOT / "examples" / "file-triage"), "--run", run_id)
    assert res.code == 0, res.stderr
    events = graphrun("events", run_id, "--json").json_lines()
    inspected = sum(
        1
        for e in events
        if e["type"] == "NodeEntered" and e["node_id"] == "inspect"  # type: ignore[index]
    )
    assert inspected > 1
    assert f'"inspect<br/><i>script</i><br/>×{inspected}"' in res.stdout
    assert '"nothing_to_do<br/><i>end</i><br/>not visited"' in res.stdout
    dot = graphrun(
        "graph", str(ROOT / "examples" / "file-triage"), "--run", run_id, "--format", "dot"
    )
    assert f'label="inspect\\n(script)\\n×{inspected}"' in dot.stdout


def test_the_written_report_is_the_page_and_replaces_the_old_one_whole(
    graphrun: GraphrunCli, tmp_path, monkeypatch
):
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.observe import report

    graphrun("import", str(ROOT / "replays" / "file-triage.run.jsonl"))
    run_id = graphrun.last_run()
    (tmp_path / "out").mkdir()
    out = tmp_path / "out" / "r.html"
    out.write_text("the old page")
    res = graphrun("report", run_id, "-o", str(out))
    assert res.code == 0, res.stderr
    store = SqliteStore(graphrun.db)
    try:
        assert out.read_text() == report.build_report(store, run_id)
        # A page that fails half way leaves the last whole one, and no partial file.
        out.write_text("the old page")

        def half(*args, **kwargs):
            yield "<!DOCTYPE html>"
            raise RuntimeError("the store went away")

        monkeypatch.setattr(report, "report_parts", half)
        with pytest.raises(RuntimeError, match="the store went away"):
            report.write_report(store, run_id, out)
    finally:
        store.close()
    assert out.read_text() == "the old page"
    assert [p.name for p in out.parent.iterdir()] == ["r.html"]


def test_a_watch_stops_on_the_page_it_wrote_not_on_a_later_look(tmp_path, monkeypatch):
    """The run ends just after a page of it in progress is written: the watch
    writes the ended page before it stops, never leaving "in progress" behind."""
    from click.testing import CliRunner

    from graphrun.cli import cli
    from graphrun.eventstore.events import RunCompleted
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.observe import report
    from tests.conformance.store_contract import started, step

    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    store.append("r1", [started(), *step("a", 1, 1, None)])
    real = report.write_report
    shown: list[str] = []

    def then_the_run_ends(*args, **kwargs):
        shown.append(real(*args, **kwargs))
        if len(shown) == 1:
            store.append("r1", [RunCompleted(node_id="a", output="done")])
        return shown[-1]

    monkeypatch.setattr(report, "write_report", then_the_run_ends)
    out = tmp_path / "r.html"
    try:
        res = CliRunner().invoke(
            cli, ["report", "r1", "-o", str(out), "--watch", "0.01", "--db", str(db)]
        )
    finally:
        store.close()
    assert res.exit_code == 0, res.output
    assert shown == ["running", "completed"]
    page = out.read_text()
    assert "in progress" not in page and 'http-equiv="refresh"' not in page


@pytest.mark.parametrize(
    ("last", "code"),
    [
        ("failed", 1),
        ("cancelled", 1),
        ("completed_with_errors", 4),
        ("waiting", 3),
        ("completed", 0),
    ],
)
def test_a_watch_exits_as_the_run_stands(tmp_path, last, code):
    """A watch that stops says how the run stands in its exit code, as `tail` does:
    a script waiting on a run's report never reads a failed run as a success.
    Without --watch, a report written is exit 0 whatever the run came to."""
    from click.testing import CliRunner

    from graphrun.cli import cli
    from graphrun.eventstore.events import (
        HumanInputRequested,
        NodeEntered,
        RunCancelled,
        RunCompleted,
        RunFailed,
    )
    from graphrun.eventstore.store import SqliteStore
    from tests.conformance.store_contract import started, step

    ending = {
        "failed": [RunFailed(error="boom", node_id="a")],
        "cancelled": [RunCancelled(reason="stop")],
        "completed_with_errors": [
            RunCompleted(
                node_id="a",
                output="done",
                unhandled_failures=[{"node": "a", "visit": 1, "error": "boom"}],
            )
        ],
        "waiting": [
            NodeEntered(node_id="ask", node_type="approval", visit=1),
            HumanInputRequested(node_id="ask", visit=1, kind="approval", question="ok?"),
        ],
        "completed": [RunCompleted(node_id="a", output="done")],
    }[last]
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    try:
        store.append("r1", [started(), *step("a", 1, 1, "ask"), *ending])
    finally:
        store.close()
    out = tmp_path / "r.html"
    watched = CliRunner().invoke(
        cli, ["report", "r1", "-o", str(out), "--watch", "0.01", "--db", str(db)]
    )
    assert watched.exit_code == code, watched.output
    assert watched.output.count(f"wrote {out}") == 1
    once = CliRunner().invoke(cli, ["report", "r1", "-o", str(out), "--db", str(db)])
    assert once.exit_code == 0, once.output


def test_a_watch_of_a_run_no_process_drives_stops(tmp_path):
    """A run whose process is gone (no lease held, nothing appended) is watched for
    three looks and two seconds at least, then given up on, saying why; so is it by
    `tail`, which exits as the run stands (interrupted)."""
    import time

    from click.testing import CliRunner

    from graphrun.cli import cli
    from graphrun.eventstore.store import SqliteStore
    from graphrun.runtime.observe.follow import IDLE_GRACE_S
    from tests.conformance.store_contract import started, step

    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    try:
        store.append("r1", [started(), *step("a", 1, 1, "b")])
    finally:
        store.close()
    out = tmp_path / "r.html"
    began = time.monotonic()
    res = CliRunner().invoke(
        cli, ["report", "r1", "-o", str(out), "--watch", "0.05", "--db", str(db)]
    )
    assert time.monotonic() - began >= IDLE_GRACE_S
    assert res.exit_code == 1, res.output  # as `tail` exits on it (below)
    assert res.output.count(f"wrote {out}") >= 3
    assert res.output.splitlines()[-1] == (
        "run r1 is interrupted (no process drives it): stopped watching; "
        "`graphrun resume r1` continues it"
    )
    assert "in progress" in out.read_text()
    began = time.monotonic()
    tail = CliRunner().invoke(cli, ["tail", "r1", "--interval", "0.05", "--db", str(db)])
    assert time.monotonic() - began >= IDLE_GRACE_S
    assert tail.output.splitlines()[-1] == (
        "▸ run r1 is interrupted: no process drives it; `graphrun resume r1` continues it"
    )
    assert tail.exit_code == 1
