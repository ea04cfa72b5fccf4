"""Structured output helpers: the schema hint, the JSON fast path, validation."""

from __future__ import annotations

import pytest

from graphrun.actors.llm.structured import (
    extractor_system,
    parse_json_output,
    schema_hint,
    strip_fences,
    validate,
)

SCHEMA = {
    "type": "object",
    "properties": {
        "action": {"type": "string"},
        "items": {"type": "array", "items": {"type": "string"}},
        "priority": {"type": "string", "enum": ["low", "medium", "high"]},
    },
    "required": ["action", "items", "priority"],
}


def test_schema_hint_is_the_spec_text_with_the_schema_indented_two() -> None:
    assert schema_hint({"type": "object", "required": ["a"]}) == (
        "Respond with a JSON object that matches this schema. Output ONLY the JSON\n"
        "object with no surrounding prose or markdown fences.\n"
        "\n"
        "Schema:\n"
        "{\n"
        '  "type": "object",\n'
        '  "required": [\n'
        '    "a"\n'
        "  ]\n"
        "}"
    )


def test_extractor_prompt_ends_with_the_schema() -> None:
    prompt = extractor_system(SCHEMA)
    assert "Extract a JSON object that matches" in prompt
    assert prompt.endswith('"required": [\n    "action",\n    "items",\n    "priority"\n  ]\n}')


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": 1}', '{"a": 1}'),
        ('  \n{"a": 1}\n ', '{"a": 1}'),
        ('```json\n{"a": 1}\n```', '{"a": 1}'),
        ('```\n{"a": 1}\n```\n', '{"a": 1}'),
        ('```JSON {"a": 1}```', '{"a": 1}'),
        ('Here: ```json\n{"a": 1}\n```', 'Here: ```json\n{"a": 1}\n```'),
    ],
)
def test_strip_fences_removes_only_an_enclosing_fence(text: str, expected: str) -> None:
    assert strip_fences(text) == expected


def test_parse_json_output_fast_path_accepts_fenced_valid_json() -> None:
    text = '```json\n{"action": "buy", "items": ["milk"], "priority": "high"}\n```'
    assert parse_json_output(text, SCHEMA) == (
        {"action": "buy", "items": ["milk"], "priority": "high"},
        None,
    )


def test_parse_json_output_reports_invalid_json() -> None:
    value, error = parse_json_output("Sure! The answer is {action: buy}", SCHEMA)
    assert value is None
    assert error == "output is not valid JSON: Expecting value: line 1 column 1 (char 0)"


def test_parse_json_output_reports_empty_output() -> None:
    assert parse_json_output("  ", SCHEMA) == (None, "output is empty")


def test_parse_json_output_reports_where_the_schema_fails() -> None:
    text = '{"action": "buy", "items": ["milk", 3], "priority": "high"}'
    assert parse_json_output(text, SCHEMA) == (
        None,
        "output does not match the schema at $.items[1]: 3 is not of type 'string'",
    )


def test_parse_json_output_without_schema_accepts_any_json() -> None:
    assert parse_json_output("[1, 2]") == ([1, 2], None)


def test_validate_names_a_missing_required_property() -> None:
    assert validate({"action": "x", "items": []}, SCHEMA) == (
        "output does not match the schema at $: 'priority' is a required property"
    )
    assert validate({"action": "x", "items": [], "priority": "low"}, SCHEMA) is None


def test_validate_reports_an_invalid_schema_instead_of_raising() -> None:
    assert validate({}, {"type": "no-such-type"}) == (
        "output_schema is not a valid JSON Schema: 'no-such-type' is not valid under any of "
        "the given schemas"
    )
