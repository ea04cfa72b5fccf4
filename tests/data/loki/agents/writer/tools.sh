#!/usr/bin/env bash
set -eo pipefail

# shellcheck disable=SC1090
source "$LLM_PROMPT_UTILS_FILE"
source "$LLM_ROOT_DIR/agents/.shared/utils.sh"

# @env LLM_OUTPUT=/dev/stdout
# @env LLM_AGENT_VAR_PROJECT_DIR=.
# @describe Writer agent tools

# @cmd Append a line to a file in the project directory
# @option --path! Path relative to the project directory
# @option --line! The line to append
append_line() {
    local target
    target="$(project_dir)/${argc_path}"
    guard_path "$target" "Append to $target?"
    printf "%s\n" "$argc_line" >> "$target"
    info "appended to ${argc_path}" >> "$LLM_OUTPUT"
}

# @cmd Say where the project is, and run a helper found on PATH
where_am_i() {
    {
        echo "project=$(project_dir)"
        loki-helper ping
    } >> "$LLM_OUTPUT"
}
