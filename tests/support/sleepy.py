"""A one-script agent whose script records its process ids and sleeps ``$NAP`` seconds:
what the cancel and durable-effect tests stop, kill and resume."""

from __future__ import annotations

SLEEPY = """
name: sleepy
version: "1.0"
start: nap
nodes:
  nap:
    type: script
    script: scripts/nap.sh
    timeout: 120
    next: done
  done:
    type: end
    output: "{{slept}}"
"""
NAP_SH = """\
echo $$ >> "$PIDS"
sleep "${NAP:-0}" &
echo $! >> "$PIDS"
wait
echo '{"slept": "yes"}'
"""

__all__ = ["NAP_SH", "SLEEPY"]
