#!/usr/bin/env bash
# @describe A tool whose script exits before its function can run.

main() {
    echo "never printed" >> "$LLM_OUTPUT"
}

exit 0
