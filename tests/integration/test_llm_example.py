"""The ticket-triage example: its README command offline, its recording, and regressions."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.fake_llm import http_error, text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "ticket-triage"
RECORDING = ROOT / "replays" / "ticket-triage.run.jsonl"

PROMPT = (
    "I was charged twice for my Pro plan this month: two payments of 49 USD on March 3, "
    "invoices INV-20931 and INV-20932. Please refund the duplicate charge. "
    "Account: dana@brightpixel.io"
)
#: What the model answered when the recording was made (the fake server replays them).
CLASSIFICATION = {
    "category": "billing",
    "priority": "high",
    "summary": "Customer was charged twice (49 USD, INV-20931 and INV-20932) for the Pro "
    "plan on March 3 and asks for the duplicate to be refunded.",
}
DRAFT = (
    "Hi Dana,\n\n"
    "Thanks for letting us know, and sorry for the trouble. I can see both Pro plan "
    "payments of 49 USD from March 3 (INV-20931 and INV-20932). Since the second one is "
    "a duplicate within the same billing period, I have requested a refund of INV-20932. "
    "It will go back to your original payment method within 5-10 business days, and you "
    "will get an email confirmation once it is issued.\n\n"
    "If anything else on your invoices looks off, just reply to this message.\n\n"
    "Billing team, Nimbus Cloud"
)
REPLIES = (text(json.dumps(CLASSIFICATION)), text(DRAFT))
EXPECTED = (
    "Category: billing\n"
    "Priority: high (first response within 4 h)\n"
    "Team:     Billing\n"
    f"Summary:  {CLASSIFICATION['summary']}\n\n"
    f"Draft reply:\n{DRAFT}"
)


def _cli(graphrun, *args: str, cwd: Path = ROOT, **env: str) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-m", "graphrun.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env=graphrun.env(**env),
    )


def _recorded_events() -> list[dict[str, object]]:
    lines = RECORDING.read_text(encoding="utf-8").splitlines()[1:]  # after the header
    records = [json.loads(line) for line in lines if line.strip()]
    return [record["event"] for record in records if "event" in record]  # not the trailer


def _readme_command() -> list[str]:
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    first = next(line for line in readme.splitlines() if line.startswith("graphrun "))
    return shlex.split(first)


def test_readme_first_command_runs_offline_without_a_key(graphrun):
    argv = _readme_command()
    assert argv[:3] == ["graphrun", "run", "examples/ticket-triage"]
    assert argv[3] == PROMPT
    assert argv[4:] == ["--llm-replay", "replays/ticket-triage.run.jsonl"]
    # no key, no base URL; a proxy that does not exist, so any network use would fail
    result = _cli(graphrun, *argv[1:], HTTPS_PROXY="http://127.0.0.1:9", ALL_PROXY="")
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == EXPECTED
    assert "▸ classify -> route" in result.stderr
    assert "▸ route -> draft_reply" in result.stderr


def test_recording_passes_graphrun_test(graphrun):
    result = _cli(graphrun, "test", "replays/ticket-triage.run.jsonl")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 0 failed" in result.stdout


def test_recording_matches_a_live_run_against_the_fake_server(graphrun, fake_llm):
    fake_llm.script(*REPLIES)
    result = _cli(
        graphrun, "run", str(EXAMPLE), PROMPT, OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-live",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == EXPECTED
    # today's graph sends exactly the requests that were recorded
    recorded = [event["request"] for event in _recorded_events() if event["type"] == "LlmCalled"]
    assert [r.body for r in fake_llm.requests] == recorded
    classify = fake_llm.requests[0].body
    assert classify["temperature"] == 0.0
    assert "Respond with a JSON object" in classify["messages"][0]["content"]
    assert "Billing team at Nimbus Cloud" in fake_llm.requests[1].body["messages"][0]["content"]


def test_other_category_is_routed_to_a_person(graphrun, fake_llm):
    fake_llm.script(
        text('{"category": "other", "priority": "low", "summary": "Asks for a partnership."}')
    )
    result = _cli(
        graphrun, "run", str(EXAMPLE), "Do you have a reseller programme?",
        OPENAI_BASE_URL=fake_llm.url_openai, OPENAI_API_KEY="sk-live",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        "Needs a person: not a support request (category 'other'); forward it"
    )
    assert len(fake_llm.requests) == 1  # no reply drafted


def test_classification_failure_is_handed_to_a_person(graphrun, fake_llm):
    fake_llm.script(http_error(401, "Incorrect API key provided"))
    result = _cli(
        graphrun, "run", str(EXAMPLE), "My site is down", OPENAI_BASE_URL=fake_llm.url_openai,
        OPENAI_API_KEY="sk-wrong",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Needs a person: LLM node failed: HTTP 401")
    assert len(fake_llm.requests) == 1  # 401 is not retried


def test_replay_detects_a_changed_prompt(graphrun, tmp_path: Path):
    changed = tmp_path / "ticket-triage"
    shutil.copytree(EXAMPLE, changed)
    graph = changed / "graph.yaml"
    source = graph.read_text(encoding="utf-8")
    assert "      Ticket:\n      {{initial_prompt}}" in source
    graph.write_text(
        source.replace("      Ticket:\n", "      Customer ticket:\n", 1), encoding="utf-8"
    )
    imported = _cli(graphrun, "import", str(RECORDING))
    assert imported.returncode == 0, imported.stderr
    (run_id,) = json.loads(RECORDING.read_text(encoding="utf-8").splitlines()[0])["runs"]

    same = _cli(graphrun, "replay", run_id, "--graph", str(EXAMPLE))
    assert same.returncode == 0, same.stderr
    diverged = _cli(graphrun, "replay", run_id, "--graph", str(changed))
    assert diverged.returncode == 1
    assert "Traceback" not in diverged.stderr
    report = diverged.stdout + diverged.stderr
    assert "node 'classify', field 'prompt': the node's prompt changed" in report
    assert "-Ticket:\n+Customer ticket:" in report
