#!/usr/bin/env bash
# Prints the number of words of the prompt (a fixed answer keeps the fixture simple).
echo '{"words": 4}'
