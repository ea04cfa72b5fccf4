"""``validate`` checks what the graph can know before a run pays for anything: the
keys templates read against the keys the graph can write, shared writes of declared
keys in a parallel step, and every error of every phase at once."""

from __future__ import annotations

CLASSIFY = """\
name: bugdesk
version: "1.0"
model: openai:gpt-test
start: classify
nodes:
  classify:
    type: llm
    prompt: "Classify {{initial_prompt}}"
    output_schema:
      type: object
      properties:
        category: {type: string}
      required: [category]
    next: review
  review:
    type: approval
    question: "File this {{categroy}} bug?"
    options: [file, drop]
    routes: {file: done, drop: done}
    on_other: done
  done:
    type: end
    output: "{{category}}"
"""


def test_a_template_typo_of_a_declared_key_is_an_error_with_did_you_mean(graphrun, agent):
    root = agent(CLASSIFY)
    res = graphrun("validate", str(root))
    assert res.code == 2
    graph = root / "graph.yaml"
    assert (
        f"error: {graph}:17 ($.nodes.review.question): node 'review': {{{{categroy}}}} in "
        "review.question: 'categroy' is not a state key the graph declares (no node, "
        "initial_state or reducer writes it) (did you mean 'category'?)"
    ) in res.stderr.splitlines()
    # `run` refuses it before any LLM call (no server is even configured).
    ran = graphrun("run", str(root), "x", OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    assert ran.code == 2
    assert "did you mean 'category'?" in ran.stderr
    assert graphrun("runs", "--json").stdout == ""


def test_keys_from_initial_state_reducers_and_map_collect_are_known(graphrun, agent):
    root = agent(
        """\
        name: known
        version: "1.0"
        start: each
        initial_state: {items: [1, 2], seen: []}
        reducers: {seen: append}
        nodes:
          each:
            type: map
            over: "{{items}}"
            as: it
            branch: one
            collect_into: results
            next: done
          one:
            type: approval
            question: "{{it}}"
            options: [a]
            routes: {a: done}
            on_other: done
          done:
            type: end
            output: "{{results}} {{seen}} {{initial_prompt}} {{_error}}"
        """
    )
    res = graphrun("validate", str(root))
    assert "template-unknown-key" not in res.stderr
    assert "is not a state key" not in res.stderr


def test_after_a_script_only_a_near_miss_is_a_warning(graphrun, agent):
    root = agent(
        """\
        name: scripted
        version: "1.0"
        start: count
        initial_state: {total: 0}
        nodes:
          count:
            type: script
            script: scripts/count.py
            next: done
            fallback: done
          done:
            type: end
            output: "{{report}} {{totl}}"
        """,
        {"scripts/count.py": "print('{}')\n"},
    )
    res = graphrun("validate", str(root))
    assert res.code == 0, res.stderr
    assert "'report'" not in res.stderr  # a script may set it
    assert (
        "node 'done': {{totl}} in done.output: 'totl' is not a state key the graph declares "
        "(unless a script's JSON output sets it) (did you mean 'total'?)"
    ) in res.stderr


PARALLEL = """\
name: fan
version: "1.0"
start: split
{reducers}
nodes:
  split:
    type: script
    script: scripts/noop.py
    next: [count, tag]
    fallback: done
  count:
    type: script
    script: scripts/noop.py
    state_updates: {{meta: "{{{{meta}}}}"}}
    next: done
    fallback: done
  tag:
    type: script
    script: scripts/noop.py
    state_updates: {{meta: "{{{{meta}}}}"}}
    next: done
    fallback: done
  done:
    type: end
    output: "{{{{meta}}}}"
"""


def test_parallel_scripts_declaring_a_shared_key_need_a_reducer(graphrun, agent):
    files = {"scripts/noop.py": "print('{}')\n"}
    res = graphrun("validate", str(agent(PARALLEL.format(reducers=""), files)))
    assert res.code == 2
    assert (
        "nodes [count, tag] all write key 'meta' in the same parallel super-step "
        "(fan-out of 'split') and no reducer is declared"
    ) in res.stderr
    # Declaring the key it writes is not a read of a sibling's write.
    assert "reads state key" not in res.stderr
    fixed = graphrun(
        "validate", str(agent(PARALLEL.format(reducers="reducers: {meta: merge}"), files))
    )
    assert fixed.code == 0, fixed.stderr


def test_an_approval_with_next_and_no_on_other_reports_everything_at_once(graphrun, agent):
    root = agent(
        """\
        name: gate
        version: "1.0"
        start: review
        nodes:
          review:
            type: approval
            question: "Ship?"
            options: [ship, hold]
            next: done
          done:
            type: end
            output: "ok"
        """
    )
    res = graphrun("validate", str(root))
    assert res.code == 2
    err = res.stderr
    assert "approval node 'review' is missing the required field 'on_other'" in err
    assert "its `next` is ignored: move that target to on_other" in err
    assert "approval 'review': option 'ship' has no routes entry" in err
    assert "approval 'review': option 'hold' has no routes entry" in err
    assert "warning: " in err and "approval 'review': `next` is ignored" in err


def test_run_names_the_typo_of_a_required_field(graphrun, agent):
    root = agent(
        """\
        name: typo
        version: "1.0"
        model: openai:gpt-test
        start: ask
        nodes:
          ask:
            type: llm
            promt: "hi"
            next: done
          done:
            type: end
            output: "ok"
        """
    )
    for command in ("validate", "run"):
        res = graphrun(command, str(root))
        assert res.code == 2
        assert "'promt' is written instead: rename it to 'prompt'" in res.stderr, command
        first = res.stderr.splitlines()[0]
        assert "missing the required field 'prompt'" in first, command


def test_a_typo_in_a_map_branch_is_the_only_error(graphrun, agent):
    root = agent(
        """\
        name: m
        version: "1.0"
        model: openai:gpt-test
        start: each
        initial_state: {items: [1, 2]}
        nodes:
          each:
            type: map
            over: "{{items}}"
            as: item
            branch: one
            collect_into: results
            next: done
          one:
            type: llm
            promt: "Say {{item}}"
          done:
            type: end
            output: "{{results}}"
        """
    )
    res = graphrun("validate", str(root))
    assert res.code == 2
    assert "collect mechanism" not in res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert "'promt' is written instead: rename it to 'prompt'" in errors[0]
