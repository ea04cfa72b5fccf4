"""A map's items and a fan-out's branches: on a terminal one live line (done,
running, failed, elapsed); piped, plain lines with a counter."""

from __future__ import annotations

import re
import sys

import pexpect

MAP = """
name: mapper
version: "1.0"
start: each
initial_state: {items: [1, 2, 3, 4, 5, 6]}
nodes:
  each:
    type: map
    over: "{{items}}"
    as: item
    branch: one
    collect_into: results
    max_concurrency: 2
    next: done
  one:
    type: script
    script: scripts/one.py
  done: {type: end, output: "{{results}}"}
"""
ONE = """
import json, os, time
time.sleep(0.6)
print(json.dumps({"output": 1}))
"""


def test_a_map_shows_one_live_line_on_a_terminal(graphrun, agent, tmp_path):
    root = agent(MAP, {"scripts/one.py": ONE})
    env = dict(graphrun.env(), TERM="xterm")
    env.pop("NO_COLOR", None)
    child = pexpect.spawn(
        sys.executable,
        ["-m", "graphrun.cli", "run", str(root)],
        env=env,
        cwd=str(tmp_path),
        encoding="utf-8",
        timeout=60,
        dimensions=(30, 140),
    )
    child.expect(r"each: [1-5]/6 done, 2 running, 0 failed")
    child.expect(pexpect.EOF)
    seen = child.before or ""
    child.close()
    assert child.exitstatus == 0
    # No line per finished item on a terminal.
    assert not re.search(r"each\[\d\] \(one\) done in", seen)


def test_piped_map_items_print_a_counter(graphrun, agent):
    res = graphrun("run", str(agent(MAP, {"scripts/one.py": ONE})))
    assert res.code == 0, res.stderr
    counters = re.findall(r"▸   each\[\d\] \(one\) done in \S+ \((\d)/6\)", res.stderr)
    assert sorted(int(c) for c in counters) == [1, 2, 3, 4, 5, 6]
    assert "\x1b" not in res.stderr


FAN = """
name: fan
version: "1.0"
start: split
nodes:
  split:
    type: script
    script: scripts/one.py
    next: [a, b]
    fallback: done
  a: {type: script, script: scripts/one.py, state_updates: {}, next: done, fallback: done}
  b: {type: script, script: scripts/one.py, state_updates: {}, next: done, fallback: done}
  done: {type: end, output: "ok"}
"""


def test_a_fan_out_counts_its_branches(graphrun, agent):
    res = graphrun("run", str(agent(FAN, {"scripts/one.py": ONE})))
    assert res.code == 0, res.stderr
    counters = re.findall(r"▸   [ab] done in \S+ \((\d)/2\)", res.stderr)
    assert sorted(counters) == ["1", "2"]
