"""GRAPHRUN_DURABILITY selects the store's synchronous mode; a bad value is a clear error."""

from __future__ import annotations


def test_full_durability_runs(graphrun, agent) -> None:
    root = agent(
        """
        name: d
        version: "1.0"
        start: done
        nodes:
          done: {type: end, output: "ok"}
        """
    )
    result = graphrun("run", str(root), GRAPHRUN_DURABILITY="full")
    assert (result.code, result.stdout) == (0, "ok\n")


def test_unknown_durability_is_a_usage_error(graphrun) -> None:
    result = graphrun("events", "some-run", GRAPHRUN_DURABILITY="sometimes")
    assert result.code == 2
    assert result.stderr == "error: unknown durability 'sometimes' (use 'normal' or 'full')\n"
