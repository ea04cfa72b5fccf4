"""Property: any run of a random script/approval/end graph, exported and imported
into a fresh database, replays with identical decisions and final state."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphrun.actors.human.prompt import FreeForm
from graphrun.eventstore import codec
from graphrun.eventstore.events import DECISION_TYPES
from graphrun.eventstore.fold import fold
from graphrun.eventstore.store import SqliteStore
from graphrun.runtime.engine.driver import Driver, RunOptions, drive, start_run
from graphrun.runtime.graph.loader import load_graph
from graphrun.runtime.replay.divergence import replay_events
from graphrun.runtime.replay.transfer import import_runs, write_export

values = st.one_of(
    st.integers(-1000, 1000),
    st.booleans(),
    st.text(alphabet="abcxyz -_.", max_size=12),
    st.lists(st.integers(0, 9), max_size=3),
)


@st.composite
def graphs(draw: Any) -> tuple[str, dict[str, str], dict[str, list[str]]]:
    """A graph.yaml, its script files and the answers of its approvals.

    Nodes n0..nk route only forward (scripts by ``_next`` or ``next``, approvals by
    their routes), so every run ends; every script prints JSON the strategy chose.
    """
    count = draw(st.integers(1, 5))
    ends = draw(st.integers(1, 2))
    kinds = [draw(st.sampled_from(["script", "script", "approval"])) for _ in range(count)]
    end_ids = [f"end{j}" for j in range(ends)]
    nodes: dict[str, Any] = {}
    files: dict[str, str] = {}
    answers: dict[str, list[str]] = {}
    for i, kind in enumerate(kinds):
        later = [f"n{j}" for j in range(i + 1, count)] + end_ids
        node_id = f"n{i}"
        if kind == "script":
            output = draw(
                st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), values, max_size=3)
            )
            if draw(st.booleans()):
                output["_next"] = draw(st.sampled_from(later))
            script = f"scripts/{node_id}.sh"
            files[script] = f"cat <<'JSON'\n{json.dumps(output)}\nJSON\n"
            nodes[node_id] = {
                "type": "script",
                "script": script,
                "next": draw(st.sampled_from(later)),
                "state_updates": {f"seen_{node_id}": "{{initial_prompt}}"},
            }
        else:
            nodes[node_id] = {
                "type": "approval",
                "question": f"Go on from {node_id}?",
                "options": ["approve", "reject"],
                "routes": {
                    "approve": draw(st.sampled_from(later)),
                    "reject": draw(st.sampled_from(later)),
                },
                "on_other": draw(st.sampled_from(later)),
                "state_updates": {f"choice_{node_id}": "{{choice}}"},
            }
            # A free-form answer is given as such (as --other gives it).
            answers[node_id] = [
                draw(st.sampled_from(["approve", "reject", FreeForm("something else")]))
            ]
    for end in end_ids:
        nodes[end] = {"type": "end", "output": f"{end}: {{{{initial_prompt}}}}"}
    graph = {"version": "1.0", "name": "random", "start": "n0", "nodes": nodes}
    return json.dumps(graph, indent=2), files, answers


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.text(alphabet="abc xyz", max_size=10))
def test_export_import_replay_reproduces_every_decision(
    case: tuple[str, dict[str, str], dict[str, list[str]]], prompt: str
) -> None:
    source, files, answers = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        agent = root / "agent"
        (agent / "scripts").mkdir(parents=True)
        (agent / "graph.yaml").write_text(source)  # JSON is YAML
        for name, text in files.items():
            (agent / name).write_text(text)
        store = SqliteStore(root / "a.db", create=True)
        run_id = start_run(store, load_graph(agent), prompt=prompt)
        outcome = drive(Driver(store, run_id, RunOptions(answers=answers)))
        assert outcome.status == "completed", outcome.error
        original = store.read(run_id)
        exported = root / "run.run.jsonl"
        with exported.open("w", encoding="utf-8") as fh:
            write_export(store, run_id, fh, relative_to=root, with_origin=True)
        store.close()

        fresh = SqliteStore(root / "b.db", create=True)
        assert import_runs(fresh, exported) == [(run_id, "imported")]
        imported = fresh.read(run_id)
        fresh.close()
        assert [codec.encode(e) for e in imported] == [codec.encode(e) for e in original]

        result = replay_events(imported, load_graph(agent), check_files=True)
        assert result.ok, result.divergence and result.divergence.format()
        assert result.decisions == sum(isinstance(e, DECISION_TYPES) for e in original)
        assert result.final is not None
        assert result.final.state == fold(original).state
        assert result.final.status == "completed"
        assert result.final.output == outcome.output
