"""Docs can't drift: every command has help and is in the README; the schema is current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphrun.cli import COMMANDS, cli
from graphrun.runtime.graph.schema import SCHEMA_FILE, generate

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_command_has_help_and_is_documented(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`graphrun {name}" in readme, f"README does not document `graphrun {name}`"


def test_top_level_help_lists_every_command() -> None:
    result = CliRunner().invoke(cli, ["--help"], terminal_width=100)
    assert result.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.output


def test_committed_schema_is_generated_from_the_structs() -> None:
    committed = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert committed == generate(), "run: graphrun schema > runtime/graph.schema.json"


def test_examples_validate_against_the_shipped_schema() -> None:
    from graphrun.runtime.graph.loader import parse_yaml
    from graphrun.runtime.graph.schema import schema_errors

    for graph in sorted((ROOT / "examples").glob("*/graph.yaml")):
        data, _lines, _problems = parse_yaml(graph.read_text(encoding="utf-8"), str(graph))
        assert schema_errors(data) == [], graph


def test_schema_rejects_what_the_loader_rejects() -> None:
    from graphrun.runtime.graph.schema import schema_errors

    bad = {
        "name": "x",
        "version": "1.0",
        "start": "a",
        "nodes": {"a": {"type": "end", "outpt": "typo"}, "b": {"type": "llm"}},
    }
    errors = dict(schema_errors(bad))
    assert "Additional properties are not allowed ('outpt' was unexpected)" in errors["$.nodes.a"]
    assert errors["$.nodes.b"] == "'prompt' is a required property"


def test_make_demo_uses_the_recorded_ticket() -> None:
    """`make demo` must send exactly the prompt the recording was made with."""
    import shlex

    readme = (ROOT / "examples" / "ticket-triage" / "README.md").read_text(encoding="utf-8")
    command = next(line for line in readme.splitlines() if line.startswith("graphrun run"))
    prompt = shlex.split(command)[3]
    assert f"DEMO_TICKET := {prompt}\n" in (ROOT / "Makefile").read_text(encoding="utf-8")
