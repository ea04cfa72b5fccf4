"""The semantic validator: every rule of the spec's Validation section.

Each case asserts the whole diagnostic text (``file:line ($.path): message (hint)``),
so a lost line number, node id or hint fails a test.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from graphrun.runtime.errors import GraphValidationError
from graphrun.runtime.graph.loader import load_text
from graphrun.runtime.graph.validate import Check, validate


def check(tmp_path: Path, graph: str, files: dict[str, str] | None = None) -> list[str]:
    """``severity: formatted`` for every finding, errors first."""
    for name, text in (files if files is not None else {"scripts/ok.py": "print('{}')"}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    loaded = load_text(textwrap.dedent(graph).lstrip(), path=Path("graph.yaml"), agent_dir=tmp_path)
    found = validate(Check(loaded, agents_dir=tmp_path / "agents", config_dir=tmp_path / "cfg"))
    return [f"{d.severity}: {d.format()}" for d in found]


def test_a_valid_graph_has_no_findings(tmp_path: Path) -> None:
    assert (
        check(
            tmp_path,
            """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            id: a
            type: script
            script: scripts/ok.py
            next: done
          done:
            type: end
            output: "{{initial_prompt}}"
    """,
        )
        == []
    )


def test_start_missing(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: strat
        nodes:
          start:
            type: end
    """,
    ) == [
        "error: graph.yaml:3 ($.start): start node 'strat' does not exist (did you mean 'start'?)",
    ]


def test_start_field_absent_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(GraphValidationError) as info:
        check(
            tmp_path,
            """
            name: g
            version: "1.0"
            nodes:
              done:
                type: end
        """,
        )
    assert str(info.value) == ("graph.yaml:1 ($): the graph is missing the required field 'start'")


def test_unknown_targets_of_next_fallback_routes_on_other(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/ok.py
            next: dnoe
            fallback: nowhere
          review:
            type: approval
            question: ok?
            options: ["yes"]
            routes:
              "yes": gone
            on_other: elsewhere
          done:
            type: end
    """,
    )[:4] == [
        "error: graph.yaml:8 ($.nodes.a.next): node 'a': next points to unknown node 'dnoe' "
        "(did you mean 'done'?)",
        "error: graph.yaml:9 ($.nodes.a.fallback): node 'a': fallback points to unknown node "
        "'nowhere'",
        "error: graph.yaml:15 ($.nodes.review.routes.yes): node 'review': routes.yes points to "
        "unknown node 'gone' (did you mean 'done'?)",
        "error: graph.yaml:16 ($.nodes.review.on_other): node 'review': on_other points to "
        "unknown node 'elsewhere'",
    ]


def test_static_cycle(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/ok.py
            next: b
          b:
            type: script
            script: scripts/ok.py
            next: a
          done:
            type: end
    """,
    )
    assert found[0] == (
        "error: graph.yaml:9 ($.nodes.b): cycle in static edges: a -> b -> a "
        "(static cycles are always errors; loop with a script's _next instead)"
    )
    assert sum(f.startswith("error") for f in found) == 1


def test_cycle_through_fallback_and_approval_routes(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/ok.py
            fallback: review
            next: done
          review:
            type: approval
            question: again?
            options: ["yes", "no"]
            routes: {"yes": a, "no": done}
            on_other: done
          done:
            type: end
    """,
    )
    assert [f for f in found if "cycle" in f] == [
        "error: graph.yaml:10 ($.nodes.review): cycle in static edges: a -> review -> a "
        "(static cycles are always errors; loop with a script's _next instead)"
    ]


def test_zero_end_nodes(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/ok.py
    """,
    ) == [
        "error: graph.yaml:4 ($.nodes): the graph has no end node, so it could never finish "
        "(add a node with type: end)",
        "warning: graph.yaml:3 ($.start): no end node is reachable from 'a' via static edges "
        "(fine if a script routes there with _next)",
    ]


def test_approval_option_without_route_and_route_without_option(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: review
        nodes:
          review:
            type: approval
            question: ok?
            options: ["yes", "no"]
            routes:
              "yes": done
              "maybe": done
            on_other: done
          done:
            type: end
    """,
    ) == [
        "error: graph.yaml:8 ($.nodes.review.options[1]): approval 'review': option 'no' has "
        "no routes entry (add routes: {'no': <node>})",
        "warning: graph.yaml:11 ($.nodes.review.routes.maybe): approval 'review': routes entry "
        "'maybe' matches no option",
    ]


def test_scripts_missing_bad_extension_and_outside(tmp_path: Path) -> None:
    (tmp_path / "outside.py").write_text("")
    agent = tmp_path / "agent"
    found = check(
        agent,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/missing.py
            next: b
          b:
            type: script
            script: scripts/ok.js
            next: c
          c:
            type: script
            script: ../outside.py
            next: d
          d:
            type: script
            script: scripts/noext
            next: done
          done:
            type: end
    """,
        {"scripts/ok.js": "", "scripts/noext": ""},
    )
    assert found == [
        f"error: graph.yaml:7 ($.nodes.a.script): script file 'scripts/missing.py' does not "
        f"exist in {agent.resolve()}",
        "error: graph.yaml:11 ($.nodes.b.script): script 'scripts/ok.js' has unsupported "
        "extension '.js' (script extensions are exactly .sh, .py and .ts)",
        "error: graph.yaml:15 ($.nodes.c.script): script '../outside.py' is outside the agent "
        f"folder ({agent.resolve().parent / 'outside.py'}) (keep it inside the folder, "
        "or let graphs read there: "
        "GRAPHRUN_ALLOWED_ROOTS=DIR (or GRAPHRUN_ALLOW_OUTSIDE_PATHS=1), set by the user who "
        "runs the graph)",
        "error: graph.yaml:19 ($.nodes.d.script): script 'scripts/noext' has unsupported "
        "extension '(none)' (script extensions are exactly .sh, .py and .ts)",
    ]


def test_script_symlink_escaping_the_agent_dir(tmp_path: Path) -> None:
    (tmp_path / "secret.py").write_text("print('{}')")
    agent = tmp_path / "agent"
    (agent / "scripts").mkdir(parents=True)
    (agent / "scripts" / "link.py").symlink_to(tmp_path / "secret.py")
    found = check(
        agent,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {type: script, script: scripts/link.py, next: done}
          done: {type: end}
    """,
        {},
    )
    assert found == [
        "error: graph.yaml:5 ($.nodes.a.script): script 'scripts/link.py' is outside the agent "
        f"folder ({tmp_path.resolve() / 'secret.py'}) (keep it inside the folder, "
        "or let graphs read there: "
        "GRAPHRUN_ALLOWED_ROOTS=DIR (or GRAPHRUN_ALLOW_OUTSIDE_PATHS=1), set by the user who "
        "runs the graph)"
    ]


def test_rag_without_documents_and_without_state_updates(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: r
        nodes:
          r:
            type: rag
            next: done
          done:
            type: end
    """,
    ) == [
        "error: graph.yaml:5 ($.nodes.r): rag node 'r' has no documents (at least one "
        "knowledge source is required)",
        "warning: graph.yaml:5 ($.nodes.r): rag node 'r' has no state_updates: its result "
        "goes nowhere",
    ]


def test_version_id_and_validation_grammar(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "2.0"
        start: a
        nodes:
          a:
            id: b
            type: input
            question: q
            validation: "len(input) ~ 3"
            next: done
          done:
            type: end
    """,
    ) == [
        'error: graph.yaml:2 ($.version): unsupported graph schema version "2.0" (only "1.0" '
        "is accepted)",
        "error: graph.yaml:6 ($.nodes.a.id): node id 'b' does not match its key 'a' (set id: a "
        "or leave id out)",
        "error: graph.yaml:9 ($.nodes.a.validation): invalid validation 'len(input) ~ 3': "
        "expected `len(input) <op> <integer>` with <op> one of >, >=, <, <=, == "
        "(e.g. `len(input) > 0`)",
    ]


@pytest.mark.parametrize(
    "rule",
    ["len(input) > 0", "len(input)>=3", "len( input ) < 10", "len(input) <= 2", "len(input) == 5"],
)
def test_every_validation_operator_is_accepted(tmp_path: Path, rule: str) -> None:
    assert (
        check(
            tmp_path,
            f"""
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {{type: input, question: q, validation: "{rule}", next: done}}
          done: {{type: end}}
    """,
        )
        == []
    )


@pytest.mark.parametrize("rule", ["len(input) > x", "input > 0", "len(input) != 1", "re(.*)"])
def test_other_validation_forms_are_errors(tmp_path: Path, rule: str) -> None:
    found = check(
        tmp_path,
        f"""
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {{type: input, question: q, validation: "{rule}", next: done}}
          done: {{type: end}}
    """,
    )
    assert len(found) == 1 and found[0].startswith(
        f"error: graph.yaml:5 ($.nodes.a.validation): invalid validation '{rule}'"
    )


def test_graph_yaml_and_config_yaml_side_by_side(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("name: x\n")
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: done
        nodes:
          done: {type: end}
    """,
    )
    assert found == [
        f"error: graph.yaml:1 ($): {tmp_path} has both graph.yaml and config.yaml (an agent is "
        "either a graph agent (graph.yaml) or an LLM-loop agent (config.yaml): remove one)"
    ]


def test_unreachable_and_no_reachable_end_are_warnings(tmp_path: Path) -> None:
    assert check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/ok.py
          done:
            type: end
    """,
    ) == [
        "warning: graph.yaml:3 ($.start): no end node is reachable from 'a' via static edges "
        "(fine if a script routes there with _next)",
        "warning: graph.yaml:8 ($.nodes.done): node 'done' is unreachable from 'a' via static "
        "edges (fine if a script routes there with _next)",
    ]


def test_approval_next_is_ignored_for_reachability(tmp_path: Path) -> None:
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: review
        nodes:
          review:
            type: approval
            question: ok?
            options: ["yes"]
            routes: {"yes": done}
            on_other: done
            next: extra
          extra:
            type: end
          done:
            type: end
    """,
    )
    assert found == [
        "warning: graph.yaml:11 ($.nodes.review.next): approval 'review': `next` is ignored "
        "(an approval routes by its answer: routes and on_other) (route each option under "
        "routes, free-form answers with on_other)",
        "warning: graph.yaml:12 ($.nodes.extra): node 'extra' is unreachable from 'review' via "
        "static edges (fine if a script routes there with _next)",
    ]


def test_agent_node_must_name_an_existing_agent(tmp_path: Path) -> None:
    (tmp_path / "agents" / "researcher").mkdir(parents=True)
    (tmp_path / "agents" / "empty").mkdir(parents=True)
    (tmp_path / "agents" / "researcher" / "config.yaml").write_text("name: researcher\n")
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a: {type: agent, agent: reseacher, prompt: p, next: b}
          b: {type: agent, agent: empty, prompt: p, next: c}
          c: {type: agent, agent: researcher, prompt: p, next: done}
          done: {type: end}
    """,
    )
    assert found == [
        f"error: graph.yaml:5 ($.nodes.a.agent): agent node 'a': no agent 'reseacher' in "
        f"{tmp_path / 'agents'} (did you mean 'researcher'?)",
        f"error: graph.yaml:6 ($.nodes.b.agent): agent node 'b': {tmp_path / 'agents' / 'empty'} "
        "has neither config.yaml nor graph.yaml",
    ]


def test_validation_error_names_the_first_error_and_counts_the_rest(tmp_path: Path) -> None:
    from graphrun.runtime.engine.driver import check_graph

    loaded = load_text(
        'name: g\nversion: "1.0"\nstart: x\nnodes:\n  a: {type: end}\n  b: {type: end, next: q}\n',
        path=Path("graph.yaml"),
        agent_dir=tmp_path,
    )
    with pytest.raises(GraphValidationError) as info:
        check_graph(loaded, agents_dir=None, config_dir=None)
    assert str(info.value) == (
        "graph.yaml:3 ($.start): start node 'x' does not exist (+1 more errors)"
    )
    assert info.value.exit_code == 2


def test_nodes_reachable_only_through_next_get_one_warning(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "ok.py").write_text("def run(state):\n    return {}\n")
    found = check(
        tmp_path,
        """
        name: g
        version: "1.0"
        start: a
        nodes:
          a:
            type: script
            script: scripts/ok.py
            next: done
          left:
            type: end
          right:
            type: end
          done:
            type: end
    """,
    )
    assert found == [
        "warning: graph.yaml:9 ($.nodes.left): nodes 'left', 'right' are unreachable from 'a' "
        "via static edges (fine if a script routes there with _next)"
    ]
