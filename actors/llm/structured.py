"""Structured output: the schema hint, the JSON fast path, schema validation.

Pure functions (no I/O): the runtime's decider uses them too, so a recorded
text always parses to the same value.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

#: The text before the schema in the hint appended to an llm node's prompt (spec wording).
SCHEMA_HINT_PREFIX = (
    "Respond with a JSON object that matches this schema. Output ONLY the JSON\n"
    "object with no surrounding prose or markdown fences.\n"
    "\n"
    "Schema:\n"
)

#: System prompt of the structured-output extractor call.
EXTRACTOR_SYSTEM_PREFIX = (
    "You convert text into structured data. Extract a JSON object that matches the\n"
    "schema below from the text the user gives you. If a value cannot be determined\n"
    "from the text, use a sensible default the schema allows (null, an empty array,\n"
    "an empty string). Output ONLY the JSON object with no surrounding prose or\n"
    "markdown fences.\n"
    "\n"
    "Schema:\n"
)

# A whole reply wrapped in one markdown code fence: ```json ... ```
_FENCE = re.compile(r"\A```[\w+-]*[ \t]*\n?(?P<body>.*?)\n?[ \t]*```\Z", re.DOTALL)


def schema_json(schema: dict[str, Any]) -> str:
    """``schema`` pretty-printed as the hint and the extractor show it."""
    return json.dumps(schema, indent=2, ensure_ascii=False)


def schema_hint(schema: dict[str, Any]) -> str:
    """The hint appended to an llm node's prompt when it has an ``output_schema``."""
    return SCHEMA_HINT_PREFIX + schema_json(schema)


def extractor_system(schema: dict[str, Any]) -> str:
    """The extractor call's system prompt for ``schema``."""
    return EXTRACTOR_SYSTEM_PREFIX + schema_json(schema)


def strip_fences(text: str) -> str:
    """``text`` without surrounding whitespace and one enclosing markdown code fence."""
    stripped = text.strip()
    match = _FENCE.match(stripped)
    return match.group("body").strip() if match else stripped


def parse_json_output(text: str, schema: dict[str, Any] | None = None) -> tuple[Any, str | None]:
    """Parse a model's reply as JSON and check it against ``schema``.

    Returns ``(value, None)`` on success and ``(None, error)`` otherwise.
    """
    cleaned = strip_fences(text)
    if not cleaned:
        return None, "output is empty"
    try:
        value = json.loads(cleaned)
    except ValueError as exc:
        return None, f"output is not valid JSON: {exc}"
    if schema is not None:
        error = validate(value, schema)
        if error is not None:
            return None, error
    return value, None


def validate(value: Any, schema: dict[str, Any]) -> str | None:
    """``None`` if ``value`` matches ``schema``, else what is wrong and where."""
    try:
        validator = _validator(json.dumps(schema, sort_keys=True))
    except Exception as exc:  # jsonschema.SchemaError, or a schema that is not JSON
        return f"output_schema is not a valid JSON Schema: {getattr(exc, 'message', exc)}"
    import jsonschema.exceptions

    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is None:
        return None
    path = "$" + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path
    )
    return f"output does not match the schema at {path}: {error.message}"


@lru_cache(maxsize=64)
def _validator(schema_text: str) -> Any:
    import jsonschema.validators

    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


__all__ = [
    "EXTRACTOR_SYSTEM_PREFIX",
    "SCHEMA_HINT_PREFIX",
    "extractor_system",
    "parse_json_output",
    "schema_hint",
    "schema_json",
    "strip_fences",
    "validate",
]
