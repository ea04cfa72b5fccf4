#!/usr/bin/env bash
set -e

# @describe Show the tool's environment.

main() {
    env | sort >> "$LLM_OUTPUT"
}
