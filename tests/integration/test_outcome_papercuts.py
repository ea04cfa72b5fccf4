"""A run's status stays true to what it waits for, and costs read the same everywhere."""

from __future__ import annotations

from tests.integration.test_human_nodes import APPROVAL, DRAFT


def _waiting(graphrun, agent) -> str:  # type: ignore[no-untyped-def]
    path = agent(APPROVAL, DRAFT)
    (path / "scripts" / "draft.sh").chmod(0o755)
    res = graphrun("run", str(path))
    assert res.code == 3, res.stderr
    return graphrun.last_run()


def test_resume_of_a_waiting_run_leaves_it_waiting(graphrun, agent):
    run_id = _waiting(graphrun, agent)
    res = graphrun("resume", run_id)
    assert res.code == 3, res.stderr
    rows = graphrun("runs", "--status", "waiting", "--json").json_lines()
    assert [r["run_id"] for r in rows] == [run_id]  # type: ignore[index]
    table = graphrun("runs").stdout.splitlines()
    line = next(line for line in table if line.startswith(run_id))
    assert " waiting " in line
    assert "approval: anyone" in line
    assert graphrun("show", run_id, "--json").json()["status"] == "waiting"  # type: ignore[index]


def test_a_reducer_type_error_names_the_state_key(graphrun, agent):
    root = agent(
        """\
        name: sums
        version: "1.0"
        start: count
        initial_state: {total: "many"}
        reducers: {total: sum}
        nodes:
          count:
            type: script
            script: scripts/count.py
            state_updates: {total: "{{total}}"}
            next: done
            fallback: done
          done:
            type: end
            output: "{{total}}"
        """,
        {"scripts/count.py": "import json\nprint(json.dumps({'total': 3}))\n"},
    )
    res = graphrun("run", str(root))
    assert res.code == 1
    assert (
        "node 'count': state key 'total' (written by 'count'): reducer 'sum' requires a number "
        "for the current value, got string"
    ) in res.stderr
