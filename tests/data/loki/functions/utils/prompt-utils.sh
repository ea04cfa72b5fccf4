#!/usr/bin/env bash
# Prompt helpers in the shape of Loki's: confirmations that AUTO_CONFIRM skips.

info() { printf "%s\n" "$*"; }
warn() { printf "warning: %s\n" "$*"; }

guard_operation() {
    if [[ "${AUTO_CONFIRM:-}" == "true" ]]; then
        return 0
    fi
    if [[ ! -t 0 ]]; then
        echo "error: '$1' needs confirmation and there is no terminal" >&2
        exit 1
    fi
    read -r -p "$1 [y/N] " answer
    [[ "$answer" == [yY]* ]] || exit 1
}

guard_path() {
    guard_operation "${2:-Write $1?}"
}
