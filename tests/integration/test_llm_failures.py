"""llm node failures through ``graphrun run``: retries, timeouts, fallback and next routing."""

from __future__ import annotations

import socket
import time

from tests.support.fake_llm import Reply, http_error, text

KEY = "sk-test-failures"


def _graph(*, attempts: int = 1, fallback: bool = False, timeout: float | None = None) -> str:
    """One llm node ``ask`` (-> ``done``, fallback ``rescue``) that records its output."""
    settings = [f"max_attempts: {attempts}"]
    if fallback:
        settings.append("fallback: rescue")
    if timeout is not None:
        settings.append(f"timeout: {timeout}")
    lines = "".join(f"    {line}\n" for line in settings)
    return f"""\
name: failing
version: "1.0"
model: openai:gpt-test
start: ask
nodes:
  ask:
    type: llm
    prompt: "Answer {{{{initial_prompt}}}}"
{lines}    state_updates:
      answer: "{{{{output}}}}"
      seen: "yes"
    next: done
  rescue:
    type: end
    output: "rescued ({{{{seen}}}}): {{{{answer}}}}"
  done:
    type: end
    output: "done ({{{{seen}}}}): {{{{answer}}}}"
"""


def _env(fake) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {"OPENAI_BASE_URL": fake.url_openai, "OPENAI_API_KEY": KEY}


def test_success_applies_state_updates_and_routes_next(graphrun, agent, fake_llm):
    root = agent(_graph(fallback=True))
    fake_llm.script(text("forty-two"))
    result = graphrun("run", str(root), "life", **_env(fake_llm))
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "done (yes): forty-two"


def test_429_is_retried_after_retry_after(graphrun, agent, fake_llm):
    root = agent(_graph(attempts=3))
    arrivals: list[float] = []
    replies = [http_error(429, "Rate limit reached", retry_after=1), text("finally")]

    def answer(request):  # type: ignore[no-untyped-def]
        arrivals.append(time.monotonic())
        return replies.pop(0)

    fake_llm.default = answer
    result = graphrun("run", str(root), "now", **_env(fake_llm))
    assert result.code == 0, result.stderr
    assert result.stdout.strip() == "done (yes): finally"
    assert len(fake_llm.requests) == 2
    assert arrivals[1] - arrivals[0] >= 0.9  # waited as retry-after asked
    # both attempts are in the log
    events = graphrun("events", graphrun.last_run(), "--json").json_lines()
    calls = [e for e in events if e["type"] == "LlmCalled"]  # type: ignore[index]
    # (attempt 1 is the default, which the log leaves out)
    attempts = [(c.get("attempt", 1), c["status"]) for c in calls]  # type: ignore[union-attr,index]
    assert attempts == [(1, 429), (2, 200)]


def test_429_gives_up_after_max_attempts(graphrun, agent, fake_llm):
    root = agent(_graph(attempts=2))
    fake_llm.script(*[http_error(429, "Rate limit reached", retry_after=0)] * 3)
    result = graphrun("run", str(root), "now", **_env(fake_llm))
    # A failure without fallback routes to next; the run completes with errors.
    assert result.code == 4, result.stderr
    assert len(fake_llm.requests) == 2
    assert result.stdout.startswith("done (yes): LLM node failed: HTTP 429")
    assert "gave up after 2 attempts" in result.stdout


def test_400_is_not_retried_and_without_fallback_routes_next(graphrun, agent, fake_llm):
    root = agent(_graph(attempts=5))
    fake_llm.script(http_error(400, "Invalid 'messages': bad role"), text("never used"))
    result = graphrun("run", str(root), "x", **_env(fake_llm))
    assert result.code == 4, result.stderr
    assert len(fake_llm.requests) == 1
    assert result.stdout.strip() == (
        "done (yes): LLM node failed: HTTP 400 from "
        f"{fake_llm.url_openai}/chat/completions: Invalid 'messages': bad role "
        "(invalid_request_error)"
    )
    assert "▸ ask failed: LLM node failed: HTTP 400" in result.stderr


def test_failure_with_fallback_routes_there(graphrun, agent, fake_llm):
    root = agent(_graph(fallback=True))
    fake_llm.script(http_error(500, "upstream exploded"))
    result = graphrun("run", str(root), "x", **_env(fake_llm))
    assert result.code == 0, result.stderr
    assert result.stdout.startswith("rescued (yes): LLM node failed: HTTP 500")
    assert "upstream exploded" in result.stdout


def test_node_timeout_fails_the_node(graphrun, agent, fake_llm):
    root = agent(_graph(fallback=True, timeout=0.5))
    fake_llm.script(Reply(text="too late", delay=5))
    started = time.monotonic()
    result = graphrun("run", str(root), "x", **_env(fake_llm))
    assert time.monotonic() - started < 4.5
    assert result.code == 0, result.stderr
    assert (
        result.stdout.strip()
        == "rescued (yes): LLM node failed: timed out after 0.5s (node timeout)"
    )


def test_unreachable_base_url_is_named_on_the_first_call(graphrun, agent):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://127.0.0.1:{port}/v1"
    root = agent(_graph(fallback=True))
    result = graphrun("run", str(root), "x", OPENAI_BASE_URL=base, OPENAI_API_KEY=KEY)
    assert result.code == 0, result.stderr
    assert result.stdout.startswith(
        f"rescued (yes): LLM node failed: could not reach {base}/chat/completions"
    )
    assert "OPENAI_BASE_URL" in result.stdout
