#!/usr/bin/env bash
set -uo pipefail
fail() {
  jq -nc --arg r "$1" '{"blocking_reason": $r, "_next": "failed"}'
  exit 0
}
project=$(cd "${LLM_AGENT_VAR_PROJECT_DIR:-.}" 2>/dev/null && pwd) || fail "no project dir"
[[ -f "$project/plans/next.md" ]] || fail "no plan at $project/plans/next.md"
jq -nc --arg p "$project" --arg s "$(cat "$project/plans/next.md")" '{"project": $p, "plan": $s}'
