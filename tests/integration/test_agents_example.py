"""The research-desk example: a graph delegating to a child agent of its own.

``replays/research-desk.run.jsonl`` was recorded with :func:`record` (the fake LLM
server answering with the scripted replies below) and exported with
``graphrun export RUN -o replays/research-desk.run.jsonl``.
"""

from __future__ import annotations

import json

from tests.conftest import ROOT, GraphrunCli
from tests.support.fake_llm import FakeLlm, Reply, text, tool_calls

EXAMPLE = ROOT / "examples" / "research-desk"
RECORDING = ROOT / "replays" / "research-desk.run.jsonl"
REQUEST = "Should we fit an air-source heat pump in our 1950s house in Oslo?"
QUESTION = (
    "How well do air-source heat pumps perform in Nordic winters, and what does a "
    "retrofit of a 1950s house in Oslo involve?"
)
FINDINGS_TEXT = (
    "From the archive:\n"
    "- In a two-winter Nordic field trial, 41 air-to-water heat pumps reached an average "
    "seasonal performance factor of 2.9; at -15 °C the COP was about 2.0 and at -25 °C "
    "about 1.5, with the backup heater covering 9 % of the yearly demand "
    "(cold-climate-field-trial.md).\n"
    "- Houses with radiators sized for 45 °C did better (SPF 3.3) than those needing "
    "55 °C or more (SPF 2.5) (cold-climate-field-trial.md).\n"
    "- 1950s houses usually needed two or three larger radiators (NOK 30,000-60,000); "
    "20 cm of loft insulation cut the heat load by about 15 %; bills fell 35-50 % "
    "compared with direct electric heating (retrofit-1950s-houses.md).\n"
    "The archive has no prices for the heat pumps themselves."
)
FINDINGS_JSON = {
    "findings": [
        "Average seasonal performance factor 2.9 in a two-winter Nordic field trial; "
        "COP about 2.0 at -15 °C and 1.5 at -25 °C; backup heat 9 % of yearly demand.",
        "Radiators sized for 45 °C gave SPF 3.3 versus 2.5 for 55 °C or more.",
        "1950s houses typically needed 2-3 larger radiators (NOK 30,000-60,000).",
        "20 cm of loft insulation cut the design heat load by about 15 %.",
        "Energy bills fell 35-50 % compared with direct electric heating.",
    ],
    "sources": ["cold-climate-field-trial.md", "retrofit-1950s-houses.md"],
}
BRIEF = (
    "Yes, it is likely worth it: in Nordic field trials air-source heat pumps kept a "
    "COP of about 2.0 at -15 °C and averaged an SPF of 2.9 [cold-climate-field-trial.md]. "
    "Plan for two or three larger radiators (NOK 30,000-60,000) so the system can run "
    "at 45 °C, where performance is best [retrofit-1950s-houses.md] "
    "[cold-climate-field-trial.md]. Insulating the loft first cuts the heat load by "
    "about 15 % and allows a smaller unit [retrofit-1950s-houses.md]. Owners saw bills "
    "fall 35-50 % compared with direct electric heating [retrofit-1950s-houses.md]."
)


def replies() -> list[Reply]:
    """What the model answers, in order: editor, fact-finder loop, extractor, editor."""
    return [
        text(QUESTION),
        tool_calls(("search_archive", {"query": "heat pump"})),
        tool_calls(
            ("read_note", {"name": "cold-climate-field-trial.md"}),
            ("read_note", {"name": "retrofit-1950s-houses.md"}),
        ),
        text(FINDINGS_TEXT),
        text(json.dumps(FINDINGS_JSON, ensure_ascii=False)),
        text(BRIEF),
    ]


def record(graphrun: GraphrunCli, fake: FakeLlm) -> str:
    """Run the example against ``fake`` and return the top-level run id."""
    fake.script(*replies())
    res = graphrun(
        "run",
        str(EXAMPLE),
        REQUEST,
        "--agents-dir",
        str(EXAMPLE / "agents"),
        OPENAI_BASE_URL=fake.url_openai,
        OPENAI_API_KEY="sk-test",
    )
    assert res.code == 0, res.stderr
    assert res.stdout.strip() == BRIEF
    rows = graphrun("runs", "--json").json_lines()
    return next(r["run_id"] for r in rows if r["parent_run_id"] is None)  # type: ignore[index]


def test_the_example_runs_its_child_agent_and_tools(
    graphrun: GraphrunCli, fake_llm: FakeLlm
) -> None:
    run_id = record(graphrun, fake_llm)

    bodies = [r.body for r in fake_llm.requests]
    assert len(bodies) == 6
    assert bodies[1]["messages"][0]["content"].startswith("You are the fact-finder")
    assert [t["function"]["name"] for t in bodies[1]["tools"]] == ["search_archive", "read_note"]
    assert bodies[1]["messages"][1]["content"] == QUESTION
    search_result = bodies[2]["messages"][-1]["content"]
    assert "cold-climate-field-trial.md: Field trial" in search_result
    assert "retrofit-1950s-houses.md: Retrofitting heat pumps" in search_result
    assert "COP of about 2.0" in bodies[3]["messages"][-2]["content"]
    assert "NOK 30,000-60,000" in bodies[3]["messages"][-1]["content"]
    assert "cold-climate-field-trial.md" in bodies[5]["messages"][-1]["content"]
    shown = graphrun("show", run_id, "--json").json()
    assert shown["state"]["sources"] == FINDINGS_JSON["sources"]  # type: ignore[index]
    (child,) = shown["children"]  # type: ignore[index]
    assert child["graph"] == "fact-finder"
    assert child["output"] == FINDINGS_TEXT


def test_the_recorded_run_replays_offline(graphrun: GraphrunCli) -> None:
    res = graphrun("test", str(RECORDING))

    assert res.code == 0, res.stdout + res.stderr
    lines = [line for line in res.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(lines) == 2 and all(line.startswith("PASS") for line in lines), res.stdout
    assert "(research-desk)" in lines[0] and "(fact-finder)" in lines[1]
