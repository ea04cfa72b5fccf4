"""``cache:`` on llm, tool and script nodes: a hit is served from an earlier run's
recorded effect (which run and seq are recorded), never across differing requests."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import GraphrunCli, write_agent
from tests.support.fake_llm import text

GRAPH = """
    name: cached
    version: "1.0"
    model: openai:gpt-test
    start: ask
    nodes:
      ask:
        type: llm
        prompt: "Summarize: {{initial_prompt}}"
        cache: {ttl: 86400}
        state_updates: {summary: "{{output}}"}
        next: done
      done: {type: end, output: "{{summary}}"}
"""


def _env(fake) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": "sk-test"}


def _events(graphrun: GraphrunCli, run_id: str) -> list[dict]:  # type: ignore[type-arg]
    return graphrun("events", run_id, "--json").json_lines()  # type: ignore[return-value]


def test_a_second_identical_request_makes_no_http_call(  # type: ignore[no-untyped-def]
    graphrun: GraphrunCli, tmp_path: Path, fake_llm
) -> None:
    root = write_agent(tmp_path / "c", GRAPH)
    fake_llm.script(text("short version"), text("another answer"))
    first = graphrun("run", str(root), "a long text", **_env(fake_llm))
    assert (first.code, first.stdout.strip()) == (0, "short version"), first.stderr
    first_id = graphrun.last_run()
    assert len(fake_llm.requests) == 1
    second = graphrun("run", str(root), "a long text", **_env(fake_llm))
    assert (second.code, second.stdout.strip()) == (0, "short version"), second.stderr
    assert len(fake_llm.requests) == 1  # served from the first run's log
    second_id = graphrun.last_run()
    marker = next(e for e in _events(graphrun, first_id) if e["type"] == "CacheChecked")
    hit = next(e for e in _events(graphrun, second_id) if e["type"] == "CacheChecked")
    assert hit["from_run"] == first_id and hit["from_seq"] == marker["seq"]
    assert hit["key"] == marker["key"]
    replayed = graphrun("replay", second_id)
    assert replayed.code == 0, replayed.stdout + replayed.stderr
    assert len(fake_llm.requests) == 1
    # A request that differs is never served from the cache.
    third = graphrun("run", str(root), "another text", **_env(fake_llm))
    assert (third.code, third.stdout.strip()) == (0, "another answer"), third.stderr
    assert len(fake_llm.requests) == 2


def test_an_expired_or_failed_entry_is_not_used(  # type: ignore[no-untyped-def]
    graphrun: GraphrunCli, tmp_path: Path, fake_llm
) -> None:
    root = write_agent(tmp_path / "c", GRAPH.replace("ttl: 86400", "ttl: 0.01"))
    fake_llm.script(text("one"), text("two"))
    assert graphrun("run", str(root), "x", **_env(fake_llm)).stdout.strip() == "one"
    assert graphrun("run", str(root), "x", **_env(fake_llm)).stdout.strip() == "two"
    assert len(fake_llm.requests) == 2


def test_the_report_names_the_hit_and_its_source(  # type: ignore[no-untyped-def]
    graphrun: GraphrunCli, tmp_path: Path, fake_llm
) -> None:
    root = write_agent(tmp_path / "c", GRAPH)
    fake_llm.script(text("short version"))
    graphrun("run", str(root), "same", **_env(fake_llm))
    first_id = graphrun.last_run()
    graphrun("run", str(root), "same", **_env(fake_llm))
    second_id = graphrun.last_run()
    out = tmp_path / "report.html"
    result = graphrun("report", second_id, "-o", str(out))
    assert result.code == 0, result.stderr
    html = out.read_text()
    assert f'cache hit: served from run <a href="#run-{first_id}">{first_id}</a> seq ' in html
