#!/usr/bin/env bash
# Shared helpers, sourced by agents' tools.sh as Loki's agents source theirs.
project_dir() {
    local dir="${LLM_AGENT_VAR_PROJECT_DIR:-.}"
    (cd "$dir" 2>/dev/null && pwd) || echo "$dir"
}
