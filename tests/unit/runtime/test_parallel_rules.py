"""The parallel format's validation rules, each with node, field and YAML line."""

from __future__ import annotations

import textwrap
from pathlib import Path

from graphrun.runtime.graph.loader import load_text
from graphrun.runtime.graph.validate import Check, validate


def check(tmp_path: Path, text: str) -> list[str]:
    source = textwrap.dedent(text)
    (tmp_path / "scripts").mkdir(exist_ok=True)
    for name in ("a.py", "b.py", "fan.py"):
        (tmp_path / "scripts" / name).write_text("print('{}')\n")
    loaded = load_text(source, path=tmp_path / "graph.yaml", agent_dir=tmp_path)
    return [f"{d.severity}:{d.rule}: {d.format()}" for d in validate(Check(loaded, deep=False))]


def test_llm_branches_writing_one_key_need_a_reducer(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: fan
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [right, left]}
          left:
            type: llm
            model: "openai:x"
            prompt: L
            next: join
            state_updates: {hits: "{{output}}"}
          right:
            type: llm
            model: "openai:x"
            prompt: R
            next: join
            state_updates: {hits: "{{output}}"}
          join: {type: end, output: "{{hits}}"}
        """,
    )
    errors = [f for f in found if f.startswith("error:fan-out-single-writer")]
    assert len(errors) == 1
    assert "nodes [left, right] all write key 'hits'" in errors[0]
    assert "no reducer is declared" in errors[0]
    assert "graph.yaml:6 ($.nodes.fan.next)" in errors[0]


def test_read_hazard_names_the_reader_and_the_writer(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: fan
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [a, b]}
          a: {type: llm, model: "openai:x", prompt: "use {{b_out}}", next: join}
          b:
            type: llm
            model: "openai:x"
            prompt: go
            next: join
            state_updates: {b_out: "{{output}}"}
          join: {type: end, output: done}
        """,
    )
    hazard = [f for f in found if "fan-out-read-hazard" in f]
    assert len(hazard) == 1
    assert (
        "node 'a' reads state key(s) `b_out` which sibling parallel branch 'b' writes"
        in (hazard[0])
    )
    assert "snapshot taken BEFORE the super-step" in hazard[0]


def test_a_reader_with_state_updates_keeps_its_prompt_reads(tmp_path: Path) -> None:
    """A node's own state_updates do not hide what its prompt reads."""
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: fan
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [a, b]}
          a:
            type: llm
            model: "openai:x"
            prompt: "use {{b_out}}"
            next: join
            state_updates: {a_out: "{{output}}"}
          b:
            type: llm
            model: "openai:x"
            prompt: go
            next: join
            state_updates: {b_out: "{{output}}"}
          join: {type: end, output: done}
        """,
    )
    hazard = [f for f in found if "fan-out-read-hazard" in f]
    assert len(hazard) == 1, found
    assert (
        "node 'a' reads state key(s) `b_out` which sibling parallel branch 'b' writes"
        in (hazard[0])
    )


def test_people_and_undeclared_scripts_in_a_fan_out(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: fan
        settings: {max_concurrency: 0}
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [ask, a]}
          ask: {type: approval, question: ok?, options: [ok], routes: {ok: done}, on_other: done}
          a: {type: script, script: scripts/a.py, next: done}
          done: {type: end, output: x}
        """,
    )
    text = "\n".join(found)
    assert "approval node 'ask' is an immediate target of a fan-out" in text
    assert "script node 'a' is in a parallel branch" in text
    assert "settings.max_concurrency must be >= 1 (got 0)" in text


def test_map_branch_contract(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: m
        nodes:
          m:
            type: map
            over: "{{items}}"
            as: item
            branch: one
            collect_into: out
            output_key: summary
            max_concurrency: 0
            next: done
          one:
            type: llm
            model: "openai:x"
            prompt: "{{item}}"
            state_updates: {summary: "{{output}}", extra: x}
            output_schema: {type: object, properties: {a: {type: string}}}
            next: done
          done: {type: end, output: x}
        """,
    )
    text = "\n".join(found)
    assert "map node 'm': max_concurrency must be >= 1 (got 0)" in text
    assert "map branch 'one' has a `next` declared" in text
    assert "map branch 'one' writes 'extra'" in text
    assert "`output_schema` with top-level properties (a)" in text
    assert "writes 'summary'" not in text


def test_uneven_join_is_a_warning(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: fan
        reducers: {t: append}
        nodes:
          fan: {type: script, script: scripts/fan.py, next: [a, b]}
          a: {type: script, script: scripts/a.py, state_updates: {}, next: join}
          b: {type: script, script: scripts/b.py, state_updates: {}, next: b2}
          b2: {type: script, script: scripts/b.py, next: join}
          join: {type: end, output: x}
        """,
    )
    uneven = [f for f in found if "uneven-join" in f]
    assert len(uneven) == 1 and uneven[0].startswith("warning:")
    assert (
        "node 'join' is reached from the fan-out of 'fan' by paths of unequal length" in (uneven[0])
    )
    assert not [f for f in found if f.startswith("error:")]


def test_lokis_later_fields_are_accepted_without_warnings(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: s
        skills_enabled: true
        inject_skill_instructions: true
        variables:
          - {name: project_dir, description: root, default: "."}
        nodes:
          s:
            type: llm
            model: "openai:x"
            prompt: "call user__select"
            reasoning_effort: high
            enabled_skills: [a]
            next: done
          done: {type: end, output: x}
        """,
    )
    assert not [f for f in found if f.startswith("error:")], found
    # skills_enabled offers skill__*, inject_skill_instructions appends their paragraph.
    assert not [f for f in found if "not-implemented" in f], found
    assert any("user__select" in f for f in found)
