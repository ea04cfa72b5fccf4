#!/usr/bin/env bash
set -e

# @describe Print the tool's environment (stdout and stderr).

main() {
    env | sort
    env | sort >&2
    exit 3
}
