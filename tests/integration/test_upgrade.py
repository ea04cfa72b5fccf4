"""``graphrun upgrade``: a fixed graph takes over runs in flight, checked by replaying
their history against it; an incompatible change is refused and nothing written."""

from __future__ import annotations

from tests.support.fake_llm import text

KEY = "sk-test-upgrade"

TYPO = """\
name: triage
version: "1.0"
model: openai:gpt-test
start: classify
nodes:
  classify:
    type: llm
    prompt: "Classify {{initial_prompt}}"
    state_updates:
      category: "{{output}}"
    next: summarize
  summarize:
    type: llm
    prompt: "Summarize the {{category.name}} ticket"
    state_updates:
      summary: "{{output}}"
    next: done
  done:
    type: end
    output: "{{category}}: {{summary}}"
"""

GATE = """\
name: gate
version: "1.0"
model: openai:gpt-test
start: draft
nodes:
  draft:
    type: llm
    prompt: "Draft {{initial_prompt}}"
    state_updates:
      title: "{{output}}"
    next: review
  review:
    type: approval
    question: "Ship {{title}}?"
    options: [ship, hold]
    routes: {ship: publish, hold: held}
    on_other: held
  publish:
    type: llm
    prompt: "Announce {{title}}"
    state_updates:
      note: "{{output}}"
    next: done
  done:
    type: end
    output: "Published: {{note}}"
  held:
    type: end
    output: "Held: {{title}}"
"""


def _env(fake) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": KEY}


def _events(graphrun, run_id: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[no-any-return]


def test_a_fixed_typo_continues_a_failed_run_without_repeating_llm_calls(
    graphrun, agent, fake_llm, tmp_path
):
    root = agent(TYPO)
    fake_llm.script(text("billing"))
    res = graphrun("run", str(root), "charged twice", **_env(fake_llm))
    assert res.code == 1
    assert "'category.name' is not in state" in res.stderr
    run_id = graphrun.last_run()
    assert len(fake_llm.requests) == 1
    resumed = graphrun("resume", run_id)
    assert resumed.code == 2
    assert f"graphrun upgrade {run_id} --graph DIR" in resumed.stderr

    fixed = agent(TYPO.replace("{{category.name}}", "{{category}}"), name="fixed")
    dry = graphrun("upgrade", run_id, "--graph", str(fixed), "--dry-run")
    assert dry.code == 0, dry.stderr
    assert "would move from graph" in dry.stderr
    assert "entering 'summarize' again" in dry.stderr
    assert not any(e["type"] == "GraphUpgraded" for e in _events(graphrun, run_id))

    fake_llm.script(text("refund the duplicate"))
    up = graphrun("upgrade", run_id, "--graph", str(fixed), **_env(fake_llm))
    assert up.code == 0, up.stderr
    assert up.stdout == "billing: refund the duplicate\n"
    assert f"▸ run {run_id} (failed): upgraded from graph " in up.stderr
    assert len(fake_llm.requests) == 2  # classify was not called again
    assert "Summarize the billing ticket" in str(fake_llm.requests[1])
    events = _events(graphrun, run_id)
    upgraded = [e for e in events if e["type"] == "GraphUpgraded"]
    assert len(upgraded) == 1
    assert upgraded[0]["old_hash"] != upgraded[0]["new_hash"]
    assert upgraded[0]["by"]
    assert upgraded[0]["was"] == "failed"
    row = graphrun("runs", "--json").json_lines()[0]
    assert row["status"] == "completed"  # type: ignore[index]
    assert row["graph_hash"] == upgraded[0]["new_hash"]  # type: ignore[index]
    # The whole log replays, against the graph it ends on.
    replayed = graphrun("replay", run_id)
    assert replayed.code == 0, replayed.stderr + replayed.stdout
    assert graphrun("audit", run_id, "--verify").code == 0


def test_an_incompatible_change_is_refused_with_the_divergence(graphrun, agent, fake_llm):
    root = agent(TYPO)
    fake_llm.script(text("billing"))
    assert graphrun("run", str(root), "charged twice", **_env(fake_llm)).code == 1
    run_id = graphrun.last_run()
    before = _events(graphrun, run_id)
    changed = agent(
        TYPO.replace("{{category.name}}", "{{category}}").replace(
            "Classify {{initial_prompt}}", "Sort {{initial_prompt}} into a queue"
        ),
        name="changed",
    )
    res = graphrun("upgrade", run_id, "--graph", str(changed))
    assert res.code == 1
    assert "not upgraded: its history does not reproduce on the new graph" in res.stderr
    assert "classify" in res.stderr
    assert "upgraded 0 of 1 run(s)" in res.stderr
    assert _events(graphrun, run_id) == before
    assert len(fake_llm.requests) == 1


def test_twenty_waiting_runs_move_onto_a_new_prompt_in_one_command(graphrun, agent, fake_llm):
    root = agent(GATE)
    fake_llm.default = lambda request: text("v2 launch")  # type: ignore[assignment,misc]
    ids = []
    for i in range(20):
        res = graphrun("run", str(root), f"item {i}", **_env(fake_llm))
        assert res.code == 3, res.stderr
        ids.append(graphrun.last_run())
    assert len(fake_llm.requests) == 20
    new = agent(GATE.replace("Announce {{title}}", "Announce {{title}} to customers"), name="v2")
    res = graphrun("upgrade", "--status", "waiting", "--agent", "gate", "--graph", str(new))
    assert res.code == 0, res.stderr
    assert "upgraded 20 of 20 run(s)" in res.stderr
    assert len(fake_llm.requests) == 20  # nothing was re-run
    rows = graphrun("runs", "--status", "waiting", "--json").json_lines()
    assert len(rows) == 20
    assert {r["graph_hash"] for r in rows} == {  # type: ignore[index]
        _events(graphrun, ids[0])[-1]["new_hash"]
    }
    done = graphrun("approve", ids[0], "ship", "--as", "alice", **_env(fake_llm))
    assert done.code == 0, done.stderr
    assert "Announce v2 launch to customers" in str(fake_llm.requests[-1])
    assert graphrun("replay", ids[0]).code == 0


def test_a_question_change_is_refused_for_waiting_runs(graphrun, agent, fake_llm):
    root = agent(GATE)
    fake_llm.script(text("v2 launch"))
    assert graphrun("run", str(root), "x", **_env(fake_llm)).code == 3
    run_id = graphrun.last_run()
    new = agent(GATE.replace("Ship {{title}}?", "Release {{title}}?"), name="q")
    res = graphrun("upgrade", run_id, "--graph", str(new), "--json")
    assert res.code == 1
    data = res.json_lines()[0]
    assert data["result"] == "refused"  # type: ignore[index]
    assert "question" in str(data["why"])  # type: ignore[index]


def test_upgrade_needs_runs_and_a_valid_graph(graphrun, agent):
    root = agent(GATE)
    res = graphrun("upgrade", "--graph", str(root))
    assert res.code == 2
    assert "name the runs to upgrade" in res.stderr
    bad = agent(GATE.replace("start: draft", "start: drfat"), name="bad")
    res = graphrun("upgrade", "--status", "waiting", "--graph", str(bad))
    assert res.code == 2
    assert "did you mean 'draft'?" in res.stderr


NAPPER = """\
name: napper
version: "1.0"
start: work
nodes:
  work:
    type: script
    script: scripts/work.py
    next: done
  done:
    type: end
    output: "v1 {{done}}"
"""

WORK_PY = """\
import json, os, pathlib, time
pathlib.Path(os.environ["MARK"]).write_text("started")
time.sleep(float(os.environ.get("NAP", "0")))
print(json.dumps({"done": "yes"}))
"""


def test_an_interrupted_run_goes_on_on_the_new_graph(graphrun, agent, tmp_path):
    import signal

    from tests.integration.test_durable_effects import wait_for

    root = agent(NAPPER, {"scripts/work.py": WORK_PY})
    mark = tmp_path / "mark"
    proc = graphrun.popen("run", str(root), MARK=str(mark), NAP="60")
    wait_for(mark.exists)
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    run_id = graphrun.last_run()
    new = agent(NAPPER.replace("v1 {{done}}", "v2 {{done}}"), {"scripts/work.py": WORK_PY})
    res = graphrun("upgrade", run_id, "--graph", str(new), MARK=str(mark), NAP="0")
    assert res.code == 0, res.stderr
    assert res.stdout == "v2 yes\n"
    assert f"▸ run {run_id} (interrupted): upgraded from graph" in res.stderr


def test_from_seq_continues_a_fork_on_the_new_graph(graphrun, agent, fake_llm):
    root = agent(TYPO)
    fake_llm.script(text("billing"))
    assert graphrun("run", str(root), "charged twice", **_env(fake_llm)).code == 1
    run_id = graphrun.last_run()
    seq = next(
        e["seq"]
        for e in _events(graphrun, run_id)
        if e["type"] == "NodeCompleted" and e["node_id"] == "classify"
    )
    fixed = agent(TYPO.replace("{{category.name}}", "{{category}}"), name="fixed")
    fake_llm.script(text("refund"))
    res = graphrun(
        "upgrade", run_id, "--graph", str(fixed), "--from-seq", str(seq), **_env(fake_llm)
    )
    assert res.code == 0, res.stderr
    assert f"▸ forked run {run_id} at seq {seq} as run " in res.stderr
    assert res.stdout == "billing: refund\n"
    assert len(fake_llm.requests) == 2
    rows = {r["run_id"]: r for r in graphrun("runs", "--json").json_lines()}  # type: ignore[index]
    assert rows[run_id]["status"] == "failed"  # the original stays as it was
