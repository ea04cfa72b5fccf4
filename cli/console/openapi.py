"""The OpenAPI document of the console's JSON API (``/api/openapi.json``)."""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}


def _op(summary: str, *, body: dict[str, Any] | None = None, ok: str = "200") -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "responses": {
            ok: {"description": "OK", "content": {"application/json": {"schema": {}}}},
            "401": {
                "description": "not signed in",
                "content": {"application/json": {"schema": _ERROR}},
            },
            "403": {"description": "refused", "content": {"application/json": {"schema": _ERROR}}},
        },
    }
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return op


_ANSWER = {
    "type": "object",
    "description": "With a session: pending (from /statement) and credential (the "
    "passkey's assertion). With an API token or a trusted proxy: node, visit, answer.",
    "properties": {
        "node": {"type": "string"},
        "visit": {"type": "integer"},
        "answer": {"type": "string"},
        "other": {"type": "boolean", "description": "a free-form answer (on_other)"},
        "pending": {"type": "string"},
        "credential": {"type": "object"},
    },
}


def document(base: str = "") -> dict[str, Any]:
    """The OpenAPI 3.1 description of every ``/api/`` route."""
    run_id = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "graphrun console API",
            "version": "1",
            "description": "Runs, their events, what waits for a person, and answers. "
            "Authenticate with a session cookie (the console's pages) or "
            "`Authorization: Bearer <token>` (`graphrun serve --token NAME` makes one). "
            "Writes from a browser need the console's Origin and an X-CSRF-Token header.",
        },
        "servers": [{"url": base or "/"}],
        "components": {
            "securitySchemes": {
                "token": {"type": "http", "scheme": "bearer"},
                "session": {"type": "apiKey", "in": "cookie", "name": "graphrun_session"},
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {"error": {"type": "string"}, "hint": {"type": "string"}},
                    "required": ["error"],
                }
            },
        },
        "security": [{"token": []}, {"session": []}],
        "paths": {
            "/api/runs": {
                "get": {
                    **_op("A page of runs, newest first"),
                    "parameters": [
                        {"name": n, "in": "query", "schema": {"type": t}}
                        for n, t in (
                            ("status", "string"),
                            ("agent", "string"),
                            ("q", "string"),
                            ("after", "string"),
                            ("limit", "integer"),
                        )
                    ],
                },
                "post": _op(
                    "Start a run of an agent of the agents directory (queued for workers "
                    "on PostgreSQL)",
                    body={
                        "type": "object",
                        "required": ["agent"],
                        "properties": {
                            "agent": {"type": "string"},
                            "prompt": {"type": "string"},
                            "set": {"type": "object"},
                        },
                    },
                    ok="201",
                ),
            },
            "/api/runs/{run_id}": {"get": {**_op("One run"), "parameters": [run_id]}},
            "/api/runs/{run_id}/events": {
                "get": {
                    **_op("A run's events (after seq `after`)"),
                    "parameters": [
                        run_id,
                        {"name": "after", "in": "query", "schema": {"type": "integer"}},
                    ],
                }
            },
            "/api/waits": {"get": _op("What waits for the caller to answer")},
            "/api/runs/{run_id}/statement": {
                "post": {
                    **_op(
                        "The decision statement to sign for an answer, and the passkey "
                        "challenge bound to it",
                        body=_ANSWER,
                    ),
                    "parameters": [run_id],
                }
            },
            "/api/runs/{run_id}/answer": {
                "post": {
                    **_op(
                        "Answer the question the run waits at; refused (nothing recorded) "
                        "when not allowed, badly signed, or no longer waiting",
                        body=_ANSWER,
                    ),
                    "parameters": [run_id],
                }
            },
        },
    }


__all__ = ["document"]
